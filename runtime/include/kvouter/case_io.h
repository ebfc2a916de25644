// Case folders (SPEC §4): .npy inputs plus case.json. The .npy codec (src/npy.cpp) checks every
// header field against the file before it allocates; outputs are written atomically (temp file +
// rename) so that a failed run leaves nothing behind.
#pragma once

#include <string>

#include "kvouter/backend.h"
#include "kvouter/inputs.h"

namespace kvouter {

// Throws CaseFileError (unreadable or malformed file) or InputError (wrong dtype).
Inputs load_case(const std::string& dir);

// Writes every file of a case folder (inputs and case.json).
void save_case(const std::string& dir, const Inputs& in);

// Writes out.npy and lse.npy into dir; either both appear or neither does.
void save_outputs(const std::string& dir, const Outputs& outputs);

template <class T>
Tensor<T> load_npy(const std::string& path, const std::string& field);

// The descr of a .npy file's header ('<f4', '<f2', '<u2', ...), and numpy's name for one.
std::string npy_descr(const std::string& path, const std::string& field);
std::string npy_dtype_name(const std::string& descr);
// A float32 ('<f4'), float16 ('<f2') or bfloat16 (its bits, '<u2') .npy file, every value widened
// exactly to float32. Throws InputError when the file holds another dtype.
Tensor<float> load_npy_widened(const std::string& path, const std::string& field, Dtype dtype);
// The values of 16-bit bits, widened exactly (the float32 values an Inputs keeps beside them).
Tensor<float> widened(const Tensor<uint16_t>& bits, Dtype dtype);
// The bits of a float16 ('<f2') or bfloat16 ('<u2') file, and their writer.
Tensor<uint16_t> load_npy_bits(const std::string& path, const std::string& field, Dtype dtype);
void save_npy_bits(const std::string& path, const Tensor<uint16_t>& bits, Dtype dtype);
template <class T>
void save_npy(const std::string& path, const Tensor<T>& t);

}  // namespace kvouter
