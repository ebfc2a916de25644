// The .npy codec of case folders (format 1.0-3.0, C order, little-endian).
//
// Reading checks every header field against the file before it allocates or copies anything.
// Halide's load_npy (tools/halide_image_io.h), used here before, trusts the header; fuzz_npy and
// follow-up checks found that a 12-byte file makes it allocate a header string of up to 2 GiB (or
// throw an untyped std::length_error), that a shape whose byte count overflows crashes it (a write
// through the null of a failed allocation), and that with assertions on (the asan preset) it
// aborts on valid empty arrays such as q with Tq = 0. Its writer aborts on empty arrays likewise.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "kvouter/case_io.h"
#include "kvouter/errors.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the .npy codec assumes a little-endian host");

namespace kvouter {

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicSize = 6;

template <class T>
struct NpyType;
template <>
struct NpyType<float> {
  static constexpr const char* descr = "<f4";
};
template <>
struct NpyType<int32_t> {
  static constexpr const char* descr = "<i4";
};
template <>
struct NpyType<int64_t> {
  static constexpr const char* descr = "<i8";
};
template <>
struct NpyType<uint16_t> {  // bfloat16 bits; float16 files are read as their bits too ("<f2")
  static constexpr const char* descr = "<u2";
};

// numpy's type name of a descr such as '<f4' (float32), for dtype errors.
std::string dtype_name(const std::string& descr) {
  if (descr.size() < 3) return "'" + descr + "'";
  const char kind = descr[1];
  const char* name = kind == 'f' ? "float" : kind == 'i' ? "int" : kind == 'u' ? "uint" : nullptr;
  const std::string bytes = descr.substr(2);
  if (!name || bytes.find_first_not_of("0123456789") != std::string::npos || bytes.size() > 2) {
    return "'" + descr + "'";
  }
  return std::string(name) + std::to_string(8 * std::stoi(bytes)) +
         (descr[0] == '>' ? " (big-endian)" : "");
}

struct NpyHeader {
  std::string descr;
  bool fortran_order = false;
  std::vector<int64_t> shape;
};

// The header is a Python dict literal with exactly the keys 'descr', 'fortran_order' and 'shape'.
class HeaderParser {
 public:
  explicit HeaderParser(const std::string& s) : s_(s) {}

  NpyHeader parse() {
    NpyHeader h;
    bool has_descr = false, has_order = false, has_shape = false;
    expect('{');
    while (true) {
      skip_space();
      if (peek() == '}') break;
      const std::string key = string();
      skip_space();
      expect(':');
      skip_space();
      if (key == "descr" && !has_descr) {
        h.descr = string();
        has_descr = true;
      } else if (key == "fortran_order" && !has_order) {
        h.fortran_order = boolean();
        has_order = true;
      } else if (key == "shape" && !has_shape) {
        h.shape = tuple();
        has_shape = true;
      } else {
        fail("unexpected key '" + key + "'");
      }
      item_separator('}');
    }
    ++pos_;
    skip_space();
    if (pos_ != s_.size()) fail("trailing bytes after the dict");
    if (!has_descr || !has_order || !has_shape)
      fail("the dict lacks 'descr', 'fortran_order' or 'shape'");
    return h;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw CaseFileError("malformed .npy header at byte " + std::to_string(pos_) + ": " + what);
  }
  char peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  void skip_space() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r'))
      ++pos_;
  }
  // After a dict or tuple item: a ',' (consumed) or the closing `close` (left for the caller).
  void item_separator(char close) {
    skip_space();
    if (peek() == ',') {
      ++pos_;
    } else if (peek() != close) {
      fail(std::string("expected ',' or '") + close + "'");
    }
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++pos_;
  }
  std::string string() {
    const char quote = peek();
    if (quote != '\'' && quote != '"') fail("expected a quoted string");
    const size_t end = s_.find(quote, pos_ + 1);
    if (end == std::string::npos) fail("unterminated string");
    std::string v = s_.substr(pos_ + 1, end - pos_ - 1);
    pos_ = end + 1;
    return v;
  }
  bool boolean() {
    for (const auto& [word, value] :
         {std::pair<const char*, bool>{"True", true}, {"False", false}}) {
      if (s_.compare(pos_, std::strlen(word), word) == 0) {
        pos_ += std::strlen(word);
        return value;
      }
    }
    fail("expected True or False");
  }
  std::vector<int64_t> tuple() {
    std::vector<int64_t> v;
    expect('(');
    while (true) {
      skip_space();
      if (peek() == ')') break;
      if (peek() < '0' || peek() > '9') fail("expected a non-negative extent");
      int64_t e = 0;
      while (peek() >= '0' && peek() <= '9') {
        if (__builtin_mul_overflow(e, 10, &e) || __builtin_add_overflow(e, peek() - '0', &e)) {
          fail("an extent beyond 64 bits");
        }
        ++pos_;
      }
      v.push_back(e);
      item_separator(')');
    }
    ++pos_;
    return v;
  }

  const std::string& s_;
  size_t pos_ = 0;
};

// Reads the preamble and header; `offset` is then where the payload starts.
NpyHeader read_header(std::ifstream& f, uint64_t file_size, uint64_t& offset_out) {
  char pre[12];
  if (file_size < 10 || !f.read(pre, 10)) throw CaseFileError("shorter than a .npy preamble");
  if (std::memcmp(pre, kMagic, kMagicSize) != 0) throw CaseFileError("not a .npy file (bad magic)");
  const int major = static_cast<unsigned char>(pre[6]), minor = static_cast<unsigned char>(pre[7]);
  if (major < 1 || major > 3 || minor != 0) {
    throw CaseFileError("unsupported .npy version " + std::to_string(major) + "." +
                        std::to_string(minor));
  }
  uint64_t header_len = static_cast<unsigned char>(pre[8]) | static_cast<unsigned char>(pre[9])
                                                                 << 8;
  uint64_t offset = 10;
  if (major >= 2) {
    if (file_size < 12 || !f.read(pre + 10, 2)) throw CaseFileError("shorter than a .npy preamble");
    header_len |= static_cast<uint64_t>(static_cast<unsigned char>(pre[10])) << 16 |
                  static_cast<uint64_t>(static_cast<unsigned char>(pre[11])) << 24;
    offset = 12;
  }
  if (header_len > file_size - offset) {
    throw CaseFileError("header of " + std::to_string(header_len) + " bytes in a file of " +
                        std::to_string(file_size));
  }
  std::string text(header_len, '\0');
  if (!f.read(text.data(), static_cast<std::streamsize>(header_len)))
    throw CaseFileError("cannot read the header");
  offset += header_len;
  offset_out = offset;
  return HeaderParser(text).parse();
}

// `descr` is the file's expected element type (by default T's own).
template <class T>
Tensor<T> read_npy(std::ifstream& f, uint64_t file_size, const std::string& field,
                   const char* descr = NpyType<T>::descr) {
  uint64_t offset = 0;
  const NpyHeader h = read_header(f, file_size, offset);
  if (h.descr != descr) {
    throw InputError(field + " dtype", dtype_name(descr), dtype_name(h.descr));
  }
  if (h.fortran_order) throw CaseFileError("Fortran-order arrays are not supported (save C order)");
  int64_t count = 1, bytes = 0;
  for (int64_t e : h.shape) {
    if (__builtin_mul_overflow(count, e, &count))
      throw CaseFileError("the shape's element count overflows");
  }
  if (__builtin_mul_overflow(count, static_cast<int64_t>(sizeof(T)), &bytes) ||
      static_cast<uint64_t>(bytes) != file_size - offset) {
    throw CaseFileError("shape " + shape_str(h.shape) + " needs " +
                        (bytes > 0 ? std::to_string(bytes) : std::string("more")) +
                        " payload bytes, the file has " + std::to_string(file_size - offset));
  }
  Tensor<T> t;
  t.shape = h.shape;
  t.data.resize(static_cast<size_t>(count));
  if (count > 0 &&
      !f.read(reinterpret_cast<char*>(t.data.data()), static_cast<std::streamsize>(bytes))) {
    throw CaseFileError("cannot read the payload");
  }
  return t;
}

}  // namespace

namespace {

// Opens `path` and calls read(f, size), with the file named in a CaseFileError.
template <class Read>
auto with_npy_file(const std::string& path, const std::string& field, Read read) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    throw CaseFileError(field + ": missing file " + path);
  const uint64_t size = std::filesystem::file_size(path, ec);
  std::ifstream f(path, std::ios::binary);
  if (ec || !f) throw CaseFileError(field + ": cannot read " + path + ": cannot open");
  try {
    return read(f, size);
  } catch (const CaseFileError& e) {
    throw CaseFileError(field + ": cannot read " + path + ": " + e.what());
  }
}

}  // namespace

template <class T>
Tensor<T> load_npy(const std::string& path, const std::string& field) {
  return with_npy_file(path, field, [&](std::ifstream& f, uint64_t size) { return read_npy<T>(f, size, field); });
}

std::string npy_descr(const std::string& path, const std::string& field) {
  return with_npy_file(path, field, [&](std::ifstream& f, uint64_t size) {
    uint64_t offset = 0;
    return read_header(f, size, offset).descr;
  });
}

std::string npy_dtype_name(const std::string& descr) { return dtype_name(descr); }

Tensor<uint16_t> load_npy_bits(const std::string& path, const std::string& field, Dtype dtype) {
  return with_npy_file(path, field, [&](std::ifstream& f, uint64_t size) {
    return read_npy<uint16_t>(f, size, field, dtype == Dtype::kFloat16 ? "<f2" : "<u2");
  });
}

Tensor<float> widened(const Tensor<uint16_t>& bits, Dtype dtype) {
  Tensor<float> t;
  t.shape = bits.shape;
  t.data.resize(bits.data.size());
  widen(dtype, bits.data.data(), bits.numel(), t.data.data());
  return t;
}

Tensor<float> load_npy_widened(const std::string& path, const std::string& field, Dtype dtype) {
  if (dtype == Dtype::kFloat32) return load_npy<float>(path, field);
  return widened(load_npy_bits(path, field, dtype), dtype);
}

namespace {

template <class T>
void write_npy(const std::string& path, const Tensor<T>& t, const char* descr) {
  std::string shape = "(";
  for (size_t i = 0; i < t.shape.size(); ++i) shape += (i ? ", " : "") + std::to_string(t.shape[i]);
  shape += t.shape.size() == 1 ? ",)" : ")";
  std::string header = std::string("{'descr': '") + descr +
                       "', 'fortran_order': False, 'shape': " + shape + ", }";
  // numpy's layout: spaces, then '\n', so that the payload starts on a 64-byte boundary.
  auto padded = [&](size_t pre) {
    return header.size() + 1 + (64 - (pre + header.size() + 1) % 64) % 64;
  };
  const bool v1 = padded(10) <= 65535;
  const size_t pre = v1 ? 10 : 12;
  header.append(padded(pre) - header.size() - 1, ' ');
  header += '\n';
  std::string preamble(kMagic, kMagicSize);
  preamble += v1 ? '\x01' : '\x02';
  preamble += '\0';
  for (size_t i = 0; i < pre - 8; ++i)
    preamble += static_cast<char>((header.size() >> (8 * i)) & 0xff);
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(preamble.data(), static_cast<std::streamsize>(preamble.size()));
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  f.write(reinterpret_cast<const char*>(t.data.data()),
          static_cast<std::streamsize>(t.data.size() * sizeof(T)));
  f.close();
  if (!f) throw CaseFileError("cannot write " + path);
}

}  // namespace

template <class T>
void save_npy(const std::string& path, const Tensor<T>& t) {
  write_npy(path, t, NpyType<T>::descr);
}

void save_npy_bits(const std::string& path, const Tensor<uint16_t>& bits, Dtype dtype) {
  write_npy(path, bits, dtype == Dtype::kFloat16 ? "<f2" : "<u2");
}

template Tensor<float> load_npy<float>(const std::string&, const std::string&);
template Tensor<int32_t> load_npy<int32_t>(const std::string&, const std::string&);
template Tensor<int64_t> load_npy<int64_t>(const std::string&, const std::string&);
template void save_npy<float>(const std::string&, const Tensor<float>&);
template void save_npy<int32_t>(const std::string&, const Tensor<int32_t>&);
template void save_npy<int64_t>(const std::string&, const Tensor<int64_t>&);

}  // namespace kvouter
