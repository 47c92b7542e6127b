// hcp-set-mesh: the module records the ranks it runs on.
// RUN: hybridcp-opt %s --hcp-set-mesh="cp=2 dp=4 ep=8" | FileCheck %s --check-prefix=EP
// RUN: hybridcp-opt %s --hcp-set-mesh="dp=4" | FileCheck %s --check-prefix=DP
// RUN: hybridcp-opt %s --hcp-set-mesh="cp=2 dp=2 ep=3" --verify-diagnostics --split-input-file

// cp2 x dp4 with the experts split over all 8 ranks; dp alone (cp = 1, every rank the whole
// sequence of its own micro-batch).
// EP: module attributes {dist.mesh = #dist.mesh<cp = 2, dp = 4, ep = 8>}
// DP: module attributes {dist.mesh = #dist.mesh<cp = 1, dp = 4>}

// An ep that does not divide the world is refused in the user's terms.
// expected-error @+1 {{ep=3 does not divide the 4 ranks of cp=2 x dp=2: an ep group is ep consecutive ranks}}
module {
}
