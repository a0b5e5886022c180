#pragma once
// Finite-difference gradient check of code that runs collectives: every rank of `group` calls it
// at once, with its own inputs, and the ranks run the check in lockstep.
//
// The checked scalar is global: L = sum over ranks r of <w_r, out_r>, with fixed random weights w_r
// per rank. The analytic gradient of a rank's input is what backward leaves in it after every rank
// seeded backward with its own w_r (the distributed backward carries the other ranks' part of L).
// The numeric gradient perturbs one element of one rank's input at a time; every rank reruns `fn`
// (so the collectives inside still match) and the ranks' contractions are summed with an
// all_reduce. Each rank compares the elements of its own inputs; `ok` is true on every rank only
// when every rank passed. fn must call the same collectives on every rank.
#include "framework/autograd/gradcheck.h"
#include "framework/distributed/process_group.h"

namespace cpf::dist {

GradcheckReport gradcheck(ProcessGroup& group, const GradcheckFn& fn, const std::vector<Tensor>& inputs,
                          GradcheckOptions options = {});

}  // namespace cpf::dist
