// The .npy codec (runtime/src/npy.cpp): round trips, numpy's header layout, and the malformed files
// that fuzz_npy found crashing or exhausting memory in Halide's loader (their bytes are also kept
// in tests/fuzz/corpus/fuzz_npy/crash_*).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>
#include <filesystem>
#include <fstream>

#include "case_gen.h"
#include "kvouter/case_io.h"
#include "kvouter/errors.h"

namespace kvouter {
namespace {

class NpyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("kvouter_npy_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string write(const std::string& name, const std::string& bytes) const {
    std::ofstream(path(name), std::ios::binary) << bytes;
    return path(name);
  }
  static std::string header(const std::string& dict, char version = 1) {
    std::string h = dict;
    const size_t pre = version == 1 ? 10 : 12;
    h.append((64 - (pre + h.size() + 1) % 64) % 64, ' ');
    h += '\n';
    std::string s = std::string("\x93NUMPY", 6) + version + '\0';
    for (size_t i = 0; i < pre - 8; ++i) s += static_cast<char>((h.size() >> (8 * i)) & 0xff);
    return s + h;
  }
  template <class T>
  static std::string expect_error(const std::string& file) {
    try {
      load_npy<T>(file, "x");
    } catch (const CaseFileError& e) {
      return e.what();
    }
    ADD_FAILURE() << "no CaseFileError for " << file;
    return "";
  }

  std::filesystem::path dir_;
};

TEST_F(NpyTest, RoundTripsEveryDtypeAndRank) {
  Tensor<float> f({2, 3});
  for (size_t i = 0; i < f.data.size(); ++i) f.data[i] = 0.5f * static_cast<float>(i) - 1.f;
  save_npy(path("f.npy"), f);
  const Tensor<float> f2 = load_npy<float>(path("f.npy"), "f");
  EXPECT_EQ(f2.shape, f.shape);
  EXPECT_EQ(f2.data, f.data);
  Tensor<int64_t> one({1}, 42);
  save_npy(path("i.npy"), one);
  EXPECT_EQ(load_npy<int64_t>(path("i.npy"), "i").data, one.data);
  Tensor<int32_t> scalar;  // rank 0: one element
  scalar.data = {7};
  save_npy(path("s.npy"), scalar);
  const Tensor<int32_t> s2 = load_npy<int32_t>(path("s.npy"), "s");
  EXPECT_TRUE(s2.shape.empty());
  EXPECT_EQ(s2.data, scalar.data);
}

// Halide's codec asserted on empty arrays (q of a Tq = 0 case) in builds with assertions.
TEST_F(NpyTest, EmptyArraysRoundTrip) {
  Tensor<float> q({0, 4, 8});
  save_npy(path("q.npy"), q);
  const Tensor<float> back = load_npy<float>(path("q.npy"), "q");
  EXPECT_EQ(back.shape, q.shape);
  EXPECT_TRUE(back.data.empty());
}

TEST_F(NpyTest, WritesNumpysHeaderLayout) {
  save_npy(path("a.npy"), Tensor<int32_t>({3}));
  std::ifstream f(path("a.npy"), std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  ASSERT_EQ(bytes.size(), 128u + 12u);  // the payload starts on a 64-byte boundary
  EXPECT_EQ(bytes.substr(10, 57), "{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }");
  EXPECT_EQ(bytes.substr(67, 60), std::string(60, ' '));
  EXPECT_EQ(bytes[127], '\n');
}

TEST_F(NpyTest, ReadsEveryHeaderVersionAndKeyOrder) {
  const std::string payload(8, '\0');
  EXPECT_EQ(
      load_npy<int32_t>(
          write("v2.npy",
                header("{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }", 2) + payload),
          "x")
          .shape,
      (std::vector<int64_t>{2}));
  EXPECT_EQ(
      load_npy<int32_t>(
          write("v3.npy",
                header("{\"shape\": (1, 2), \"fortran_order\": False, \"descr\": \"<i4\"}", 3) +
                    payload),
          "x")
          .shape,
      (std::vector<int64_t>{1, 2}));
}

// A 12-byte file whose header claims 4 GiB: Halide's loader allocated (and filled) it.
TEST_F(NpyTest, HeaderLongerThanTheFileIsRejectedBeforeAllocating) {
  const std::string msg =
      expect_error<float>(write("h.npy", std::string("\x93NUMPY\x02\x00\xf4\xff\xff\xff", 12)));
  EXPECT_NE(msg.find("header of 4294967284 bytes in a file of 12"), std::string::npos) << msg;
}

// A shape whose byte count overflows: Halide's loader wrote through a failed allocation.
TEST_F(NpyTest, ShapesWhoseBytesOverflowOrDisagreeWithThePayloadAreRejected) {
  std::string msg =
      expect_error<float>(write("o.npy", header("{'descr': '<f4', 'fortran_order': False, 'shape': "
                                                "(2147483647, 2147483647, 2147483647, 8), }")));
  EXPECT_NE(msg.find("overflows"), std::string::npos) << msg;
  msg = expect_error<float>(write(
      "t.npy",
      header("{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }") + std::string(12, '\0')));
  EXPECT_NE(msg.find("needs 16 payload bytes, the file has 12"), std::string::npos) << msg;
  msg = expect_error<float>(
      write("n.npy", header("{'descr': '<f4', 'fortran_order': False, 'shape': (-4, 2), }")));
  EXPECT_NE(msg.find("non-negative extent"), std::string::npos) << msg;
}

TEST_F(NpyTest, MalformedHeadersAreCaseFileErrors) {
  for (const char* dict :
       {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,)", "{'descr': '<f4', 'shape': (2,)}",
        "{'descr': '<f4', 'fortran_order': Maybe, 'shape': (2,)}",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (2,)} junk", "", "{"}) {
    expect_error<float>(write("m.npy", header(dict) + std::string(8, '\0')));
  }
  expect_error<float>(write("short.npy", "\x93NUM"));
  expect_error<float>(write("magic.npy", std::string("\x93NUMPZ\x01\x00\x00\x00", 10)));
  expect_error<float>(write(
      "fortran.npy",
      header("{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }") + std::string(8, '\0')));
}

TEST_F(NpyTest, WrongDtypeIsAnInputErrorNamingBoth) {
  const std::string f =
      write("d.npy", header("{'descr': '>i4', 'fortran_order': False, 'shape': (2,), }") +
                         std::string(8, '\0'));
  try {
    load_npy<int32_t>(f, "selected");
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(), "selected dtype: expected int32, got int32 (big-endian)");
  }
}


// 16-bit storage (SPEC section 1): float16 and bfloat16 files widen exactly to float32.
TEST_F(NpyTest, SixteenBitFilesWidenExactly) {
  // float16: 1, -2, 65504 (max), 2^-24 (smallest subnormal), 2^-14 (smallest normal), -0, inf.
  const std::vector<uint16_t> h = {0x3C00, 0xC000, 0x7BFF, 0x0001, 0x0400, 0x8000, 0x7C00};
  const std::vector<float> hf = {1.f, -2.f, 65504.f, 5.9604644775390625e-8f, 6.103515625e-5f, -0.f,
                                 std::numeric_limits<float>::infinity()};
  std::string payload(reinterpret_cast<const char*>(h.data()), h.size() * 2);
  write("h.npy", header("{'descr': '<f2', 'fortran_order': False, 'shape': (7,), }") + payload);
  const Tensor<float> th = load_npy_widened(path("h.npy"), "q", Dtype::kFloat16);
  ASSERT_EQ(th.data.size(), hf.size());
  for (size_t i = 0; i < hf.size(); ++i) {
    EXPECT_EQ(th.data[i], hf[i]) << i;
    EXPECT_EQ(std::signbit(th.data[i]), std::signbit(hf[i])) << i;
  }
  EXPECT_TRUE(std::isnan(load_npy_widened(write("nan.npy", header("{'descr': '<f2', 'fortran_order': False, 'shape': (1,), }") +
                                                               std::string("\x01\x7e", 2)),
                                          "q", Dtype::kFloat16)
                             .data[0]));
  // bfloat16 bits: the upper half of the float32 value (1.5, -3.25, the float32 subnormal 2^-133).
  const std::vector<float> bf = {1.5f, -3.25f, 0x1p-133f};
  std::vector<uint16_t> bits;
  for (float f : bf) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    bits.push_back(static_cast<uint16_t>(u >> 16));
  }
  write("b.npy", header("{'descr': '<u2', 'fortran_order': False, 'shape': (3,), }") +
                     std::string(reinterpret_cast<const char*>(bits.data()), bits.size() * 2));
  const Tensor<float> tb = load_npy_widened(path("b.npy"), "k_pages", Dtype::kBFloat16);
  for (size_t i = 0; i < bf.size(); ++i) EXPECT_EQ(tb.data[i], bf[i]) << i;
  // A float32 file where float16 is expected is a dtype error naming both.
  save_npy(path("f.npy"), Tensor<float>({1}, 1.f));
  try {
    load_npy_widened(path("f.npy"), "q", Dtype::kFloat16);
    ADD_FAILURE() << "no InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("float16"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("float32"), std::string::npos) << e.what();
  }
}

// The case folder's storage dtype (SPEC section 1, section 3): each bad combination is an
// InputError naming the field.
TEST_F(NpyTest, CaseDtypesAgreeOrAreTypedErrors) {
  experiments::CaseSpec spec = experiments::named_shape("tiny");
  const Inputs in = experiments::make_case(spec);
  const std::string dir = path("case");
  save_case(dir, in);
  auto as_bits = [&](const char* name, const char* descr) {  // the float32 file's upper halves
    const Tensor<float> t = load_npy<float>(dir + "/" + name + ".npy", name);
    std::string payload;
    for (float f : t.data) {
      uint32_t u;
      std::memcpy(&u, &f, 4);
      const uint16_t b = static_cast<uint16_t>(u >> 16);
      payload.append(reinterpret_cast<const char*>(&b), 2);
    }
    std::string shape = "(";
    for (int64_t e : t.shape) shape += std::to_string(e) + ", ";
    write(std::string("case/") + name + ".npy",
          header("{'descr': '" + std::string(descr) + "', 'fortran_order': False, 'shape': " + shape + "), }") + payload);
  };
  auto set_json = [&](const std::string& extra) {
    std::ofstream(dir + "/case.json") << "{\"block_size\": " << in.block_size << ", \"page_size\": " << in.page_size
                                      << ", \"causal\": " << (in.causal ? "true" : "false") << extra << "}";
  };
  auto field_of_error = [&]() -> std::string {
    try {
      load_case(dir);
    } catch (const InputError& e) {
      return e.field();
    }
    return "no error";
  };
  set_json(", \"dtype\": \"float16\"");
  EXPECT_EQ(field_of_error(), "case.json dtype");  // float32 files
  set_json(", \"dtype\": \"float64\"");
  EXPECT_EQ(field_of_error(), "case.json dtype");
  set_json("");
  as_bits("k_pages", "<u2");
  EXPECT_EQ(field_of_error(), "k_pages dtype");  // mixed with q's float32
  as_bits("q", "<u2");
  as_bits("v_pages", "<u2");
  EXPECT_EQ(field_of_error(), "q dtype");  // <u2 without "dtype": "bfloat16"
  set_json(", \"dtype\": \"float16\"");
  EXPECT_EQ(field_of_error(), "q dtype");
  set_json(", \"dtype\": \"bfloat16\"");
  const Inputs b = load_case(dir);  // the bfloat16 truncation of every value, widened exactly
  ASSERT_EQ(b.q.data.size(), in.q.data.size());
  for (size_t i = 0; i < in.q.data.size(); i += 97) {
    uint32_t u;
    std::memcpy(&u, &in.q.data[i], 4);
    u &= 0xFFFF0000u;
    float want;
    std::memcpy(&want, &u, 4);
    EXPECT_EQ(b.q.data[i], want) << i;
  }
}

}  // namespace
}  // namespace kvouter
