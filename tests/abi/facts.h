// One fact about the NCCL ABI (a value, size, offset or type) as one
// translation unit sees it. facts.cc is compiled twice, once against QNCCL's
// nccl_abi.h and once against NVIDIA's nccl.h; compare.cc diffs the two lists.
#pragma once
#include <string>
#include <vector>

struct AbiFact {
  std::string name;
  std::string value;
};

std::vector<AbiFact> abi_facts_ours();
std::vector<AbiFact> abi_facts_reference();
