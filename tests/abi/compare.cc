// Compares the ABI facts of QNCCL's nccl_abi.h with those of NVIDIA's nccl.h,
// entry by entry. Prints every mismatch; exits 1 if there is any.
#include <cstdio>

#include "facts.h"

int main() {
  const std::vector<AbiFact> ours = abi_facts_ours();
  const std::vector<AbiFact> ref = abi_facts_reference();
  // Both sides expand the same generated list, so the entries line up.
  if (ours.size() != ref.size()) {
    std::printf("internal error: %zu facts vs %zu\n", ours.size(), ref.size());
    return 2;
  }
  int mismatches = 0;
  for (size_t i = 0; i < ours.size(); ++i) {
    if (ours[i].value == ref[i].value) continue;
    ++mismatches;
    std::printf("MISMATCH %s\n  nccl_abi.h: %s\n  nccl.h:     %s\n", ours[i].name.c_str(),
                ours[i].value.c_str(), ref[i].value.c_str());
  }
  std::printf("%zu facts compared, %d mismatches\n", ours.size(), mismatches);
  return mismatches ? 1 : 0;
}
