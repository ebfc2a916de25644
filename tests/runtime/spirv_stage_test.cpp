// The SPIR-V stage's rewrite (kvouter/spirv_stage.h) on small hand-written modules, positive and
// negative, and on every Vulkan kernel the build generated. Every module it rewrites must pass
// SPIRV-Tools' validator for Vulkan.
#include <gtest/gtest.h>
#include <spirv-tools/libspirv.hpp>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <string>
#include <vector>

#include "kvouter/aot.h"
#include "kvouter/aot_kernels.h"
#include "kvouter/spirv_stage.h"

namespace kvouter::spirv {
namespace {

constexpr spv_target_env kEnv = SPV_ENV_VULKAN_1_1;  // SPIR-V 1.3: BufferBlock, as Halide 21 emits, is still allowed

std::vector<uint32_t> assemble(const std::string& text) {
  spvtools::SpirvTools tools(kEnv);
  std::string log;
  tools.SetMessageConsumer([&](spv_message_level_t, const char*, const spv_position_t&, const char* m) { log += m; });
  std::vector<uint32_t> words;
  EXPECT_TRUE(tools.Assemble(text, &words, SPV_TEXT_TO_BINARY_OPTION_PRESERVE_NUMERIC_IDS)) << log;
  return words;
}

std::string disassemble(const std::vector<uint32_t>& words) {
  spvtools::SpirvTools tools(kEnv);
  std::string text;
  EXPECT_TRUE(tools.Disassemble(words, &text, SPV_BINARY_TO_TEXT_OPTION_NO_HEADER | SPV_BINARY_TO_TEXT_OPTION_FRIENDLY_NAMES));
  return text;
}

// "" when valid, else the validator's messages.
std::string validate(const std::vector<uint32_t>& words) {
  spvtools::SpirvTools tools(kEnv);
  std::string log;
  tools.SetMessageConsumer([&](spv_message_level_t, const char*, const spv_position_t&, const char* m) {
    log += std::string(m) + "\n";
  });
  spvtools::ValidatorOptions opt;
  opt.SetRelaxBlockLayout(true);
  return tools.Validate(words.data(), words.size(), opt) ? "" : (log.empty() ? "invalid" : log);
}

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

// A compute kernel shaped like Halide 21's: storage buffers as Uniform + BufferBlock, a shared
// array exchanged between invocations across OpControlBarrier + OpMemoryBarrier(device memory).
// BODY_A reads a and writes the shared array; BODY_B uses the shared value %s and buffer b.
std::string kernel(const std::string& body_b, const std::string& extra_decorations = "") {
  return R"(
OpCapability Shader
OpMemoryModel Logical GLSL450
OpEntryPoint GLCompute %main "main" %lid
OpExecutionMode %main LocalSize 32 1 1
OpName %a "a"
OpName %b "b"
OpName %blockA "blockA"
OpName %blockB "blockB"
OpDecorate %lid BuiltIn LocalInvocationId
OpDecorate %rarr ArrayStride 4
OpDecorate %blockA BufferBlock
OpMemberDecorate %blockA 0 Offset 0
OpDecorate %blockB BufferBlock
OpMemberDecorate %blockB 0 Offset 0
OpDecorate %a DescriptorSet 0
OpDecorate %a Binding 0
OpDecorate %b DescriptorSet 0
OpDecorate %b Binding 1
)" + extra_decorations + R"(
%void = OpTypeVoid
%fn = OpTypeFunction %void
%uint = OpTypeInt 32 0
%float = OpTypeFloat 32
%v3uint = OpTypeVector %uint 3
%ptr_in = OpTypePointer Input %v3uint
%lid = OpVariable %ptr_in Input
%rarr = OpTypeRuntimeArray %float
%blockA = OpTypeStruct %rarr
%blockB = OpTypeStruct %rarr
%pA = OpTypePointer Uniform %blockA
%pB = OpTypePointer Uniform %blockB
%pf = OpTypePointer Uniform %float
%a = OpVariable %pA Uniform
%b = OpVariable %pB Uniform
%uint_0 = OpConstant %uint 0
%uint_2 = OpConstant %uint 2
%uint_32 = OpConstant %uint 32
%uint_264 = OpConstant %uint 264
%uint_2376 = OpConstant %uint 2376
%sarr = OpTypeArray %float %uint_32
%psarr = OpTypePointer Workgroup %sarr
%psf = OpTypePointer Workgroup %float
%shared = OpVariable %psarr Workgroup
%main = OpFunction %void None %fn
%entry = OpLabel
%id3 = OpLoad %v3uint %lid
%x = OpCompositeExtract %uint %id3 0
%pa = OpAccessChain %pf %a %uint_0 %x
%va = OpLoad %float %pa
%ps = OpAccessChain %psf %shared %x
OpStore %ps %va
OpControlBarrier %uint_2 %uint_2 %uint_264
OpMemoryBarrier %uint_2 %uint_2376
%ps0 = OpAccessChain %psf %shared %uint_0
%s = OpLoad %float %ps0
%pb = OpAccessChain %pf %b %uint_0 %x
)" + body_b + R"(
OpReturn
OpFunctionEnd
)";
}

struct Rewritten {
  std::vector<uint32_t> words;
  std::string text;
  RewriteReport report;
};

Rewritten run(const std::string& source) {
  const auto in = assemble(source);
  EXPECT_EQ(validate(in), "") << "the test's own module must be valid";
  Rewritten r;
  r.words = rewrite(in, &r.report);
  EXPECT_EQ(validate(r.words), "") << "the rewritten module must stay valid";
  r.text = disassemble(r.words);
  return r;
}

TEST(SpirvStage, ReadOnlyBufferIsNonWritableAndWriteOnlyIsNonReadable) {
  const Rewritten r = run(kernel("OpStore %pb %s"));
  EXPECT_EQ(r.report.storage_buffers, 2);
  EXPECT_EQ(r.report.non_writable, 1);
  EXPECT_EQ(r.report.non_readable, 1);
  EXPECT_NE(r.text.find("OpMemberDecorate %blockA 0 NonWritable"), std::string::npos) << r.text;
  EXPECT_NE(r.text.find("OpMemberDecorate %blockB 0 NonReadable"), std::string::npos) << r.text;
  EXPECT_EQ(r.text.find("%blockB 0 NonWritable"), std::string::npos) << "a written buffer stays writable";
}

TEST(SpirvStage, DeviceFenceAtAWorkgroupBarrierIsRemovedWhenNoBufferIsReadAndWritten) {
  const Rewritten r = run(kernel("OpStore %pb %s"));
  EXPECT_EQ(r.report.barriers, 2);
  EXPECT_EQ(r.report.barriers_removed, 1);
  EXPECT_TRUE(r.report.fence_kept_because.empty()) << r.report.fence_kept_because;
  EXPECT_EQ(count(r.text, "OpMemoryBarrier"), 0) << r.text;
  EXPECT_EQ(count(r.text, "OpControlBarrier %uint_2 %uint_2 %uint_264"), 1) << "the workgroup barrier stays";
}

TEST(SpirvStage, BufferReadAndWrittenKeepsEveryFence) {
  // b is read and written: another invocation's store to b may be what this one loads, so the
  // device-memory ordering at the barrier is needed.
  const Rewritten r = run(kernel("%vb = OpLoad %float %pb\n%sum = OpFAdd %float %vb %s\nOpStore %pb %sum"));
  EXPECT_EQ(r.report.non_writable, 1) << "a is still read-only";
  EXPECT_EQ(r.report.non_readable, 0);
  EXPECT_EQ(r.text.find("%blockB 0 NonWritable"), std::string::npos);
  EXPECT_EQ(r.report.barriers_removed + r.report.barriers_narrowed, 0);
  EXPECT_NE(r.report.fence_kept_because.find("both read and written"), std::string::npos);
  EXPECT_EQ(count(r.text, "OpMemoryBarrier %uint_2 %uint_2376"), 1) << r.text;
}

TEST(SpirvStage, AnAccessItDoesNotUnderstandCountsAsReadAndWrite) {
  // OpCopyMemory is outside the analysis: both buffers count as read and written.
  const Rewritten r = run(kernel("OpCopyMemory %pb %pa"));
  EXPECT_EQ(r.report.non_writable, 0);
  EXPECT_EQ(r.report.non_readable, 0);
  EXPECT_EQ(count(r.text, "OpMemoryBarrier %uint_2 %uint_2376"), 1);
  EXPECT_FALSE(r.report.fence_kept_because.empty());
}

TEST(SpirvStage, AStoreThroughACopiedPointerIsAWrite) {
  const Rewritten r = run(kernel("%pb2 = OpCopyObject %pf %pb\n%vb = OpLoad %float %pb2\nOpStore %pb2 %s"));
  EXPECT_EQ(r.text.find("%blockB 0 NonWritable"), std::string::npos);
  EXPECT_EQ(count(r.text, "OpMemoryBarrier"), 1);
}

TEST(SpirvStage, ControlBarrierWithDeviceSemanticsIsNarrowedWithANewConstant) {
  // A lone OpControlBarrier ordering device memory too: narrowed to 264 (an existing constant);
  // a lone OpMemoryBarrier: narrowed to a constant the stage adds.
  std::string src = kernel("OpStore %pb %s");
  src = std::regex_replace(src, std::regex("OpControlBarrier %uint_2 %uint_2 %uint_264\nOpMemoryBarrier %uint_2 %uint_2376"),
                           "OpControlBarrier %uint_2 %uint_2 %uint_2376\nOpStore %ps %va\nOpMemoryBarrier %uint_2 %uint_2376");
  const Rewritten r = run(src);
  EXPECT_EQ(r.report.barriers_narrowed, 2);
  EXPECT_EQ(count(r.text, "OpControlBarrier %uint_2 %uint_2 %uint_264"), 1) << r.text;
  EXPECT_EQ(count(r.text, "%uint_2376"), 1) << "only its declaration is left";
  EXPECT_EQ(count(r.text, "OpMemoryBarrier %uint_2 %uint_264"), 1) << r.text;
}

TEST(SpirvStage, StorageBufferClassIsAnalysedToo) {
  // The SPIR-V 1.3+ form: StorageBuffer storage class with Block structs.
  const std::string src = R"(
OpCapability Shader
OpExtension "SPV_KHR_storage_buffer_storage_class"
OpMemoryModel Logical GLSL450
OpEntryPoint GLCompute %main "main"
OpExecutionMode %main LocalSize 1 1 1
OpName %in "in"
OpName %out "out"
OpName %blk "blk"
OpDecorate %rarr ArrayStride 4
OpDecorate %blk Block
OpMemberDecorate %blk 0 Offset 0
OpDecorate %in DescriptorSet 0
OpDecorate %in Binding 0
OpDecorate %out DescriptorSet 0
OpDecorate %out Binding 1
%void = OpTypeVoid
%fn = OpTypeFunction %void
%uint = OpTypeInt 32 0
%float = OpTypeFloat 32
%rarr = OpTypeRuntimeArray %float
%blk = OpTypeStruct %rarr
%pblk = OpTypePointer StorageBuffer %blk
%pf = OpTypePointer StorageBuffer %float
%in = OpVariable %pblk StorageBuffer
%out = OpVariable %pblk StorageBuffer
%uint_0 = OpConstant %uint 0
%main = OpFunction %void None %fn
%entry = OpLabel
%p = OpAccessChain %pf %in %uint_0 %uint_0
%v = OpLoad %float %p
%q = OpAccessChain %pf %out %uint_0 %uint_0
OpStore %q %v
OpReturn
OpFunctionEnd
)";
  const Rewritten r = run(src);
  EXPECT_EQ(r.report.storage_buffers, 2);
  // The struct is shared by both variables: the decorations go on the variables.
  EXPECT_NE(r.text.find("OpDecorate %in NonWritable"), std::string::npos) << r.text;
  EXPECT_NE(r.text.find("OpDecorate %out NonReadable"), std::string::npos) << r.text;
  EXPECT_EQ(r.text.find("OpDecorate %out NonWritable"), std::string::npos);
  EXPECT_EQ(r.text.find("%blk 0 NonWritable"), std::string::npos);
}

TEST(SpirvStage, ExistingDecorationsAreNotRepeatedAndTheRewriteIsIdempotent) {
  const Rewritten r = run(kernel("OpStore %pb %s", "OpMemberDecorate %blockA 0 NonWritable\n"));
  EXPECT_EQ(r.report.non_writable, 0);
  EXPECT_EQ(count(r.text, "NonWritable"), 1);
  RewriteReport again;
  EXPECT_EQ(rewrite(r.words, &again), r.words);
  EXPECT_FALSE(again.changed());
}

Rewritten run_preserving(const std::string& source) {
  const auto in = assemble(source);
  EXPECT_EQ(validate(in), "") << "the test's own module must be valid";
  Rewritten r;
  r.words = rewrite(in, &r.report, RewriteOptions{true});
  EXPECT_EQ(validate(r.words), "") << "the rewritten module must stay valid";
  r.text = disassemble(r.words);
  return r;
}

TEST(SpirvStage, DenormPreserveComesOnlyWhenAskedWithItsCapabilityAndExtension) {
  const std::string source = kernel("OpStore %pb %s");
  const Rewritten plain = run(source);
  EXPECT_EQ(plain.report.denorm_preserve, 0);
  EXPECT_EQ(plain.text.find("DenormPreserve"), std::string::npos) << plain.text;
  EXPECT_EQ(plain.text.find("float_controls"), std::string::npos);

  const Rewritten r = run_preserving(source);
  EXPECT_EQ(r.report.denorm_preserve, 1);
  EXPECT_TRUE(r.report.changed());
  EXPECT_EQ(count(r.text, "OpCapability DenormPreserve"), 1) << r.text;
  EXPECT_EQ(count(r.text, "OpExtension \"SPV_KHR_float_controls\""), 1) << r.text;
  EXPECT_EQ(count(r.text, "OpExecutionMode %1 DenormPreserve 32"), 1) << r.text;  // %1: the entry point
  // In SPIR-V's layout order: capabilities, extensions, memory model, entry points, modes.
  const size_t cap = r.text.find("OpCapability DenormPreserve"), ext = r.text.find("OpExtension");
  const size_t model = r.text.find("OpMemoryModel"), mode = r.text.find("DenormPreserve 32");
  EXPECT_LT(cap, ext);
  EXPECT_LT(ext, model);
  EXPECT_LT(r.text.find("OpEntryPoint"), mode);
  EXPECT_LT(r.text.find("LocalSize 32 1 1"), mode);
  // The other rewrites are unchanged by it.
  EXPECT_EQ(r.report.non_writable, plain.report.non_writable);
  EXPECT_EQ(r.report.barriers_removed, plain.report.barriers_removed);

  RewriteReport again;
  EXPECT_EQ(rewrite(r.words, &again, RewriteOptions{true}), r.words) << "idempotent";
  EXPECT_EQ(again.denorm_preserve, 0);
}

TEST(SpirvStage, AnEntryPointsOwnDenormalModeIsKept) {
  std::string source = kernel("OpStore %pb %s");
  const std::string local = "OpExecutionMode %main LocalSize 32 1 1\n";
  source.replace(source.find(local), local.size(), local + "OpExecutionMode %main DenormFlushToZero 32\n");
  source.replace(source.find("OpCapability Shader\n"), 20,
                 "OpCapability Shader\nOpCapability DenormFlushToZero\nOpExtension \"SPV_KHR_float_controls\"\n");
  const Rewritten r = run_preserving(source);
  EXPECT_EQ(r.report.denorm_preserve, 0);
  EXPECT_EQ(r.text.find("DenormPreserve"), std::string::npos) << r.text;
  EXPECT_EQ(count(r.text, "SPV_KHR_float_controls"), 1);
}

TEST(SpirvStage, DenormPreserveIsAskedOnlyOfVulkan12DevicesThatReportIt) {
  if (std::getenv("KVOUTER_SPIRV_DENORMS") || std::getenv("KVOUTER_SPIRV_STAGE")) {
    GTEST_SKIP() << "the rule under its default switches (KVOUTER_SPIRV_DENORMS or KVOUTER_SPIRV_STAGE is set)";
  }
  EXPECT_TRUE(asks_denorm_preserve(true, true));
  EXPECT_FALSE(asks_denorm_preserve(true, false)) << "a device that does not report it";
  EXPECT_FALSE(asks_denorm_preserve(false, true)) << "below Vulkan 1.2";
}

TEST(SpirvStage, MalformedModulesAreTypedErrors) {
  std::vector<uint32_t> m = assemble(kernel("OpStore %pb %s"));
  EXPECT_THROW(rewrite(m.data(), 3), SpirvError);
  std::vector<uint32_t> bad_magic = m;
  bad_magic[0] = 0x03022307;
  EXPECT_THROW(rewrite(bad_magic), SpirvError);
  std::vector<uint32_t> truncated(m.begin(), m.end() - 1);
  truncated.back() = (50u << 16) | 1u;  // claims 50 words, past the end
  EXPECT_THROW(rewrite(truncated), SpirvError);
  EXPECT_THROW(rewrite(nullptr, 0), SpirvError);
}

// The SPIR-V modules (one per kernel) inside a Halide Vulkan .stmt, as experiments/gpu/spirv_dis.py
// finds them.
std::vector<std::vector<uint32_t>> modules_of(const std::filesystem::path& stmt) {
  std::ifstream f(stmt, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::vector<uint32_t>> out;
  const char magic[4] = {0x03, 0x02, 0x23, 0x07};
  size_t pos = bytes.find("buffer vulkan_gpu_source_kernels");
  while (pos != std::string::npos && (pos = bytes.find(std::string(magic, 4), pos)) != std::string::npos) {
    size_t p = pos + 20, end = 0;
    while (p + 4 <= bytes.size()) {
      uint32_t w;
      std::memcpy(&w, bytes.data() + p, 4);
      const uint32_t n = w >> 16;
      if (n == 0 || p + 4 * n > bytes.size() || w == 0x07230203u) break;
      p += 4 * n;
      if ((w & 0xFFFF) == 56) end = p;  // OpFunctionEnd
    }
    if (!end) break;
    std::vector<uint32_t> words((end - pos) / 4);
    std::memcpy(words.data(), bytes.data() + pos, end - pos);
    out.push_back(std::move(words));
    pos = end;
  }
  return out;
}

TEST(SpirvStage, EveryGeneratedVulkanKernelStaysValidAndGetsItsDecorations) {
  int kernels = 0, narrowed = 0, kept = 0;
  halide::register_generated_aot_kernels();
  std::vector<std::string> stmts;
  for (const auto& v : halide::aot_variants()) {
    if (v.target != "host-vulkan") continue;
    for (const char* part : {"_fwd.stmt", "_comb.stmt"}) stmts.push_back(v.name + part);
  }
  for (const std::string& name : stmts) {
    const std::filesystem::path path = std::filesystem::path(KVOUTER_GENERATORS_DIR) / name;
    ASSERT_TRUE(std::filesystem::exists(path)) << path;
    for (const auto& m : modules_of(path)) {
      ++kernels;
      SCOPED_TRACE(name + " module " + std::to_string(kernels));
      ASSERT_EQ(validate(m), "") << "Halide's own module";
      RewriteReport rep;
      const auto out = rewrite(m, &rep);
      ASSERT_EQ(validate(out), "");
      RewriteReport preserving;
      ASSERT_EQ(validate(rewrite(m, &preserving, RewriteOptions{true})), "") << "with DenormPreserve 32";
      EXPECT_EQ(preserving.denorm_preserve, 1) << "one compute entry point per module";
      EXPECT_GE(rep.storage_buffers, 2);
      EXPECT_GE(rep.non_writable, 1) << "every kernel reads an input it never writes";
      EXPECT_EQ(rep.non_writable + rep.non_readable, rep.storage_buffers)
          << "each buffer of these kernels is read-only or write-only";
      if (rep.barriers > 0) {
        EXPECT_TRUE(rep.fence_kept_because.empty()) << rep.fence_kept_because;
        narrowed += rep.fence_kept_because.empty();
        kept += !rep.fence_kept_because.empty();
        RewriteReport again;
        EXPECT_EQ(rewrite(out, &again), out) << "no barrier is left ordering device memory";
      }
    }
  }
  EXPECT_GT(kernels, 20) << "the build generates dozens of Vulkan kernels";
  EXPECT_GT(narrowed, 5);
  std::printf("%d generated Vulkan kernels rewritten and valid; %d with barriers narrowed, %d kept\n", kernels,
              narrowed, kept);
}

}  // namespace
}  // namespace kvouter::spirv
