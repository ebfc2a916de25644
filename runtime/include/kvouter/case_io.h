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
template <class T>
void save_npy(const std::string& path, const Tensor<T>& t);

}  // namespace kvouter
