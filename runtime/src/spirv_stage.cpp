// The SPIR-V stage's rewrite (kvouter/spirv_stage.h). Opcodes, decorations and semantics come
// from SPIRV-Headers (Debian's spirv-headers); the module is parsed into instructions, rewritten
// and serialised again, so nothing but the instructions it adds or removes moves.
#define SPV_ENABLE_UTILITY_CODE  // spv::HasResultAndType
#include <spirv/unified1/spirv.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>

#include "kvouter/spirv_stage.h"

namespace kvouter::spirv {

namespace {

struct Inst {
  std::vector<uint32_t> w;  // w[0] = word count << 16 | opcode
  spv::Op op() const { return static_cast<spv::Op>(w[0] & spv::OpCodeMask); }
};

Inst make(spv::Op op, const std::vector<uint32_t>& operands) {
  Inst i;
  i.w.push_back(0);
  i.w.insert(i.w.end(), operands.begin(), operands.end());
  i.w[0] = (static_cast<uint32_t>(i.w.size()) << spv::WordCountShift) | static_cast<uint32_t>(op);
  return i;
}

struct Module {
  std::vector<uint32_t> header;  // five words; header[3] is the id bound
  std::vector<Inst> insts;
};

Module parse(const uint32_t* words, size_t count) {
  if (!words || count < 5) throw SpirvError("spirv: module shorter than its five-word header");
  if (words[0] != spv::MagicNumber) throw SpirvError("spirv: bad magic number (not a SPIR-V module in host byte order)");
  Module m;
  m.header.assign(words, words + 5);
  for (size_t pos = 5; pos < count;) {
    const uint32_t n = words[pos] >> spv::WordCountShift;
    if (n == 0 || pos + n > count) {
      throw SpirvError("spirv: instruction at word " + std::to_string(pos) + " runs past the module's end");
    }
    m.insts.push_back({std::vector<uint32_t>(words + pos, words + pos + n)});
    pos += n;
  }
  return m;
}

bool is_annotation(spv::Op op) {
  switch (op) {
    case spv::OpDecorate:
    case spv::OpMemberDecorate:
    case spv::OpDecorationGroup:
    case spv::OpGroupDecorate:
    case spv::OpGroupMemberDecorate:
    case spv::OpDecorateId:
    case spv::OpDecorateString:
    case spv::OpMemberDecorateString:
      return true;
    default:
      return false;
  }
}

// Operand words (after the result type and id) that may hold ids. Instructions whose trailing
// operands are literals list where they start; every other word is treated as a possible id,
// which is conservative: a literal that happens to equal a buffer pointer's id only makes the
// analysis keep more.
size_t literal_start(const Inst& i) {
  switch (i.op()) {
    case spv::OpCompositeExtract: return 4;  // result type, id, composite, literal indices
    case spv::OpCompositeInsert: return 5;
    case spv::OpVectorShuffle: return 5;
    case spv::OpExtInst: return 0;           // handled below: set id, literal instruction, ids
    case spv::OpLoopMerge: return 3;         // merge, continue, literal control (+ params)
    case spv::OpSelectionMerge: return 2;
    case spv::OpSwitch: return 3;            // selector, default, then literal/label pairs
    default: return i.w.size();
  }
}

// The storage classes of memory semantics that order device (non-workgroup) memory.
constexpr uint32_t bits(spv::MemorySemanticsMask m) { return static_cast<uint32_t>(m); }
constexpr uint32_t kDeviceMemory =
    bits(spv::MemorySemanticsUniformMemoryMask) | bits(spv::MemorySemanticsCrossWorkgroupMemoryMask) |
    bits(spv::MemorySemanticsAtomicCounterMemoryMask) | bits(spv::MemorySemanticsImageMemoryMask);
constexpr uint32_t kAnyStorageClass = kDeviceMemory | bits(spv::MemorySemanticsSubgroupMemoryMask) |
                                      bits(spv::MemorySemanticsWorkgroupMemoryMask) |
                                      bits(spv::MemorySemanticsOutputMemoryMask);

struct Access {
  bool read = false, written = false;
};

// A literal string's words: UTF-8 bytes, nul-terminated, packed little-endian into words.
std::vector<uint32_t> literal_string(const std::string& s) {
  std::vector<uint32_t> out(s.size() / 4 + 1, 0);
  for (size_t k = 0; k < s.size(); ++k) out[k / 4] |= static_cast<uint32_t>(static_cast<unsigned char>(s[k])) << (8 * (k % 4));
  return out;
}

constexpr const char* kFloatControls = "SPV_KHR_float_controls";

// Rewrite 3: the mode-setting instructions DenormPreserve 32 needs, each where SPIR-V's logical
// layout puts it (capabilities, then extensions, then execution modes after the entry points).
// Entry points that already carry a float32 denormal mode keep it.
void add_denorm_preserve(Module& m, RewriteReport& rep) {
  bool has_capability = false, has_extension = false;
  std::vector<uint32_t> entries;
  std::set<uint32_t> with_mode;
  size_t last_capability = 0, last_extension = 0, last_mode = 0;
  bool any_capability = false, any_extension = false, any_mode = false;
  const std::vector<uint32_t> ext_words = literal_string(kFloatControls);
  for (size_t n = 0; n < m.insts.size(); ++n) {
    const auto& w = m.insts[n].w;
    switch (m.insts[n].op()) {
      case spv::OpCapability:
        if (w.size() >= 2 && w[1] == spv::CapabilityDenormPreserve) has_capability = true;
        last_capability = n, any_capability = true;
        break;
      case spv::OpExtension:
        if (std::vector<uint32_t>(w.begin() + 1, w.end()) == ext_words) has_extension = true;
        last_extension = n, any_extension = true;
        break;
      case spv::OpEntryPoint:
        if (w.size() >= 3 && w[1] == spv::ExecutionModelGLCompute) entries.push_back(w[2]);
        last_mode = n, any_mode = true;
        break;
      case spv::OpExecutionMode:
      case spv::OpExecutionModeId:
        if (w.size() >= 4 && (w[2] == spv::ExecutionModeDenormPreserve || w[2] == spv::ExecutionModeDenormFlushToZero) &&
            w[3] == 32) {
          with_mode.insert(w[1]);
        }
        last_mode = n, any_mode = true;
        break;
      default:
        break;
    }
  }
  std::vector<Inst> modes;
  for (uint32_t e : entries) {
    if (!with_mode.count(e)) {
      modes.push_back(make(spv::OpExecutionMode, {e, static_cast<uint32_t>(spv::ExecutionModeDenormPreserve), 32u}));
    }
  }
  if (modes.empty() || !any_capability || !any_mode) return;
  rep.denorm_preserve = static_cast<int>(modes.size());
  const bool need_extension = m.header[1] < 0x00010400 && !has_extension;
  std::vector<Inst> out;
  out.reserve(m.insts.size() + modes.size() + 2);
  for (size_t n = 0; n < m.insts.size(); ++n) {
    out.push_back(std::move(m.insts[n]));
    if (n == last_capability) {
      if (!has_capability) out.push_back(make(spv::OpCapability, {static_cast<uint32_t>(spv::CapabilityDenormPreserve)}));
      if (need_extension && !any_extension) out.push_back(make(spv::OpExtension, ext_words));
    }
    if (need_extension && any_extension && n == last_extension) out.push_back(make(spv::OpExtension, ext_words));
    if (n == last_mode) {
      for (auto& i : modes) out.push_back(std::move(i));
    }
  }
  m.insts = std::move(out);
}

}  // namespace

std::vector<uint32_t> rewrite(const uint32_t* words, size_t count, RewriteReport* report,
                              const RewriteOptions& options) {
  Module m = parse(words, count);
  RewriteReport rep;
  if (options.denorm_preserve_32) add_denorm_preserve(m, rep);
  uint32_t bound = m.header[3];

  // Declarations: pointer types, buffer-block structs, constants, the storage-buffer variables.
  std::map<uint32_t, std::pair<uint32_t, uint32_t>> pointer_types;  // id -> (storage class, pointee)
  std::set<uint32_t> buffer_blocks;                                  // structs decorated BufferBlock
  std::map<uint32_t, uint32_t> uint_constants;                       // id -> value (32-bit unsigned)
  std::map<uint32_t, std::set<uint32_t>> decorated;                  // id -> decorations present
  std::map<std::pair<uint32_t, uint32_t>, std::set<uint32_t>> member_decorated;
  std::map<uint32_t, int> struct_users;  // struct id -> variables whose pointee it is
  uint32_t uint32_type = 0;
  std::vector<uint32_t> buffers;          // storage-buffer variables, in declaration order
  std::map<uint32_t, uint32_t> var_struct;
  for (const Inst& i : m.insts) {
    const auto& w = i.w;
    switch (i.op()) {
      case spv::OpDecorate:
        if (w.size() >= 3) decorated[w[1]].insert(w[2]);
        if (w.size() >= 3 && w[2] == spv::DecorationBufferBlock) buffer_blocks.insert(w[1]);
        break;
      case spv::OpMemberDecorate:
        if (w.size() >= 4) member_decorated[{w[1], w[2]}].insert(w[3]);
        break;
      case spv::OpTypeInt:
        if (w.size() >= 4 && w[2] == 32 && w[3] == 0 && !uint32_type) uint32_type = w[1];
        break;
      case spv::OpTypePointer:
        if (w.size() >= 4) pointer_types[w[1]] = {w[2], w[3]};
        break;
      case spv::OpConstant:
        if (w.size() == 4 && w[1] == uint32_type && uint32_type) uint_constants[w[2]] = w[3];
        break;
      case spv::OpVariable: {
        if (w.size() < 4) break;
        auto pt = pointer_types.find(w[1]);
        if (pt == pointer_types.end()) break;
        const uint32_t sc = w[3], pointee = pt->second.second;
        struct_users[pointee]++;
        const bool storage = sc == spv::StorageClassStorageBuffer ||
                             (sc == spv::StorageClassUniform && buffer_blocks.count(pointee));
        if (storage) {
          buffers.push_back(w[2]);
          var_struct[w[2]] = pointee;
        }
        break;
      }
      default:
        break;
    }
  }
  rep.storage_buffers = static_cast<int>(buffers.size());

  // Accesses: every pointer derived from a buffer variable leads back to it (SPIR-V defines an
  // id before any use outside a phi, so one pass in module order sees each chain's base first).
  std::map<uint32_t, uint32_t> root;  // pointer id -> buffer variable
  for (uint32_t v : buffers) root[v] = v;
  std::map<uint32_t, Access> access;
  bool image_writes = false;
  bool in_function = false;
  for (const Inst& i : m.insts) {
    const auto& w = i.w;
    const spv::Op op = i.op();
    if (op == spv::OpFunction) in_function = true;
    if (!in_function) continue;
    if (op == spv::OpImageWrite) image_writes = true;
    auto traced = [&](uint32_t id) -> uint32_t {
      auto it = root.find(id);
      return it == root.end() ? 0 : it->second;
    };
    bool has_result = false, has_type = false;
    spv::HasResultAndType(op, &has_result, &has_type);
    const size_t first = (has_type ? 1 : 0) + (has_result ? 1 : 0) + 1;
    switch (op) {
      case spv::OpLoad:
        if (w.size() >= 4 && traced(w[3])) access[traced(w[3])].read = true;
        continue;
      case spv::OpStore:
        if (w.size() >= 3 && traced(w[1])) access[traced(w[1])].written = true;
        if (w.size() >= 3 && traced(w[2])) access[traced(w[2])] = {true, true};  // a pointer stored away
        continue;
      case spv::OpAccessChain:
      case spv::OpInBoundsAccessChain:
      case spv::OpPtrAccessChain:
      case spv::OpInBoundsPtrAccessChain:
      case spv::OpCopyObject:
      case spv::OpBitcast:
        if (w.size() >= 4 && traced(w[3])) root[w[2]] = traced(w[3]);
        for (size_t k = 4; k < w.size(); ++k) {
          if (traced(w[k])) access[traced(w[k])] = {true, true};
        }
        continue;
      default:
        break;
    }
    // Any other use of a buffer pointer: a read and a write, as far as the stage knows.
    const size_t lit = literal_start(i);
    for (size_t k = first; k < w.size(); ++k) {
      if (op == spv::OpExtInst && k == 4) continue;  // the extended instruction's number
      if (k >= lit && op != spv::OpExtInst) break;
      if (traced(w[k])) access[traced(w[k])] = {true, true};
    }
  }

  // 1. NonWritable / NonReadable. On the member of a struct that only this variable uses (the
  // form glslang emits for `readonly buffer`), else on the variable itself.
  std::vector<Inst> new_decorations;
  for (uint32_t v : buffers) {
    const Access a = access[v];
    const uint32_t st = var_struct[v];
    const bool member_form = struct_users[st] == 1;
    auto add = [&](spv::Decoration d, int& counter) {
      if (decorated[v].count(d) || member_decorated[{st, 0}].count(d)) return;
      new_decorations.push_back(member_form ? make(spv::OpMemberDecorate, {st, 0, static_cast<uint32_t>(d)})
                                            : make(spv::OpDecorate, {v, static_cast<uint32_t>(d)}));
      ++counter;
    };
    if (!a.written) add(spv::DecorationNonWritable, rep.non_writable);
    if (!a.read && a.written) add(spv::DecorationNonReadable, rep.non_readable);
  }

  // 2. Barriers. The proof: no storage buffer is both read and written in this module (nor
  // escapes the analysis), and no image is written.
  std::string keep;
  for (uint32_t v : buffers) {
    if (access[v].read && access[v].written) {
      keep = "storage buffer %" + std::to_string(v) + " is both read and written in the module";
      break;
    }
  }
  if (keep.empty() && image_writes) keep = "the module writes an image";
  // A uint constant id for `value`, added after the 32-bit unsigned type if absent.
  std::vector<std::pair<uint32_t, uint32_t>> new_constants;  // (id, value)
  auto constant = [&](uint32_t value) -> uint32_t {
    for (const auto& [id, v] : uint_constants) {
      if (v == value) return id;
    }
    const uint32_t id = bound++;
    uint_constants[id] = value;
    new_constants.push_back({id, value});
    return id;
  };
  std::vector<Inst> out;
  out.reserve(m.insts.size() + new_decorations.size() + 2);
  const Inst* last_control = nullptr;  // the OpControlBarrier just before, if any
  std::vector<bool> drop(m.insts.size(), false);
  for (size_t n = 0; n < m.insts.size(); ++n) {
    Inst& i = m.insts[n];
    const spv::Op op = i.op();
    const bool control = op == spv::OpControlBarrier && i.w.size() == 4;
    const bool memory = op == spv::OpMemoryBarrier && i.w.size() == 3;
    if (!control && !memory) {
      last_control = nullptr;
      continue;
    }
    ++rep.barriers;
    const size_t sem_at = control ? 3 : 2, scope_at = control ? 2 : 1;
    auto sem_it = uint_constants.find(i.w[sem_at]);
    auto scope_it = uint_constants.find(i.w[scope_at]);
    if (sem_it == uint_constants.end() || scope_it == uint_constants.end()) {
      if (keep.empty()) keep = "a barrier's scope or semantics is not a 32-bit constant";
      last_control = nullptr;
      continue;
    }
    const uint32_t sem = sem_it->second;
    if (!keep.empty() || !(sem & kDeviceMemory)) {
      last_control = control ? &i : nullptr;
      continue;
    }
    // (Known constants are 32-bit unsigned, so the module declares that type for new ones.)
    const uint32_t narrowed = sem & ~kDeviceMemory;
    if (memory) {
      // Left ordering nothing, or nothing its OpControlBarrier does not: removed.
      const bool nothing = (narrowed & kAnyStorageClass) == 0;
      bool covered = false;
      if (last_control) {
        const uint32_t csem = uint_constants[last_control->w[3]];
        const uint32_t cscope = uint_constants[last_control->w[2]];
        covered = (narrowed & ~csem) == 0 && cscope == scope_it->second;
      }
      if (nothing || covered) {
        drop[n] = true;
        ++rep.barriers_removed;
        last_control = nullptr;
        continue;
      }
    }
    i.w[sem_at] = constant(narrowed);
    ++rep.barriers_narrowed;
    last_control = control ? &i : nullptr;
  }
  if (!keep.empty() && rep.barriers > 0) rep.fence_kept_because = keep;

  // Serialise: the new decorations where the annotation section ends (after its last
  // instruction, or before the first type declaration where it has none), the new constants
  // after the 32-bit unsigned type.
  size_t insert_at = m.insts.size();
  for (size_t n = 0; n < m.insts.size(); ++n) {
    const spv::Op op = m.insts[n].op();
    if (is_annotation(op)) insert_at = n + 1;
    if (op >= spv::OpTypeVoid && op <= spv::OpTypeForwardPointer) {
      if (insert_at == m.insts.size()) insert_at = n;
      break;
    }
  }
  for (size_t n = 0; n < m.insts.size(); ++n) {
    if (n == insert_at) {
      for (auto& d : new_decorations) out.push_back(std::move(d));
    }
    if (drop[n]) continue;
    const bool uint_type = m.insts[n].op() == spv::OpTypeInt && m.insts[n].w[1] == uint32_type;
    out.push_back(std::move(m.insts[n]));
    if (uint_type) {
      for (const auto& [id, value] : new_constants) out.push_back(make(spv::OpConstant, {uint32_type, id, value}));
    }
  }

  std::vector<uint32_t> result = m.header;
  result[3] = bound;
  for (const Inst& i : out) result.insert(result.end(), i.w.begin(), i.w.end());
  if (report) *report = rep;
  return result;
}

namespace {

enum class DenormMode { kDevice, kDriver, kForce };

// KVOUTER_SPIRV_DENORMS, read once per process; the driver's behaviour with the stage off.
DenormMode denorm_mode() {
  static const DenormMode mode = [] {
    const char* e = std::getenv("KVOUTER_SPIRV_DENORMS");
    if (!stage_enabled() || (e && std::strcmp(e, "driver") == 0)) return DenormMode::kDriver;
    return e && std::strcmp(e, "force") == 0 ? DenormMode::kForce : DenormMode::kDevice;
  }();
  return mode;
}

}  // namespace

bool asks_denorm_preserve(bool device_is_vulkan_1_2, bool device_reports_preserve) {
  return device_is_vulkan_1_2 && (denorm_mode() == DenormMode::kForce ||
                                  (denorm_mode() == DenormMode::kDevice && device_reports_preserve));
}

bool stage_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("KVOUTER_SPIRV_STAGE");
    return !(e && (std::strcmp(e, "off") == 0 || std::strcmp(e, "0") == 0));
  }();
  return on;
}

}  // namespace kvouter::spirv
