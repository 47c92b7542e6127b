// hcp-insert-state-scan: each segment's scan starts from the state the segments before it leave.
// RUN: hybridcp-opt %s --split-input-file --hcp-insert-state-scan=strategy=chain --verify-diagnostics | FileCheck %s --check-prefixes=CHECK,CHAIN,CORRECT
// RUN: hybridcp-opt %s --split-input-file --hcp-insert-state-scan --verify-diagnostics | FileCheck %s --check-prefixes=CHECK,AUTO,CORRECT
// RUN: hybridcp-opt %s --split-input-file --hcp-insert-state-scan=incoming=rescan --verify-diagnostics | FileCheck %s --check-prefixes=CHECK,AUTO,RESCAN
// RUN: not hybridcp-opt %s --split-input-file --hcp-insert-state-scan=incoming=twice 2>&1 | FileCheck %s --check-prefix=BADINCOMING
// RUN: not hybridcp-opt %s --split-input-file --hcp-insert-state-scan=strategy=ring 2>&1 | FileCheck %s --check-prefix=BADSTRATEGY

// Zigzag at cp = 2: 8 local tokens are 2 segments of 4, viewed as 2 * 1 rows. By default
// (incoming=correct) each segment is scanned once from a zero start; its final state and
// log-decay go to dist.state_scan (messages of [rows, heads, head_dim, state] = [2, 2, 3, 4]
// f32), and model.ssd_add_initial_state adds the outputs the incoming state contributes.
// With incoming=rescan the summary is model.ssd_final_state (the state only, no y) and the one
// full scan runs from the incoming state. With the auto strategy, 2 ranks use the all-gather.
// CHECK-LABEL: func.func @scan
// CHECK-DAG: %[[X:.+]] = model.reshape %{{.+}} : tensor<1x8x2x3xf32> -> tensor<2x4x2x3xf32>
// CHECK-DAG: %[[DT:.+]] = model.reshape %{{.+}} : tensor<1x8x2xf32> -> tensor<2x4x2xf32>
// CHECK-DAG: %[[B:.+]] = model.reshape %{{.+}} : tensor<1x8x1x4xf32> -> tensor<2x4x1x4xf32>
// CHECK: %[[G:.+]] = model.ssd_log_decay %[[DT]], %{{.+}} : (tensor<2x4x2xf32>, tensor<2xf32>) -> tensor<2x2xf32>
// CORRECT: %[[Y0:.+]], %[[LOCAL:.+]] = model.ssd_scan %[[X]], %[[DT]], %{{[^,]+}}, %[[B]], %[[C:[^,]+]], %{{[^ ]+}} {chunk_size = 4 : i64} : ({{.+}}) -> (tensor<2x4x2x3xf32>, tensor<2x2x3x4xf32>)
// RESCAN-NOT: model.ssd_scan
// RESCAN: %[[LOCAL:.+]] = model.ssd_final_state %[[X]], %[[DT]], %{{.+}}, %[[B]] {chunk_size = 4 : i64} : (tensor<2x4x2x3xf32>, tensor<2x4x2xf32>, tensor<2xf32>, tensor<2x4x1x4xf32>) -> tensor<2x2x3x4xf32>
// CHAIN: %[[IN:.+]] = dist.state_scan %[[G]], %[[LOCAL]] {layout = #dist.sequence<zigzag, cp = 2, seq = 16>, strategy = #dist.strategy<chain>} : (tensor<2x2xf32>, tensor<2x2x3x4xf32>) -> tensor<2x2x3x4xf32>
// AUTO: %[[IN:.+]] = dist.state_scan %[[G]], %[[LOCAL]] {layout = #dist.sequence<zigzag, cp = 2, seq = 16>, strategy = #dist.strategy<allgather>}
// CORRECT: %[[Y:.+]] = model.ssd_add_initial_state %[[Y0]], %[[DT]], %{{.+}}, %[[C]] init %[[IN]] : (tensor<2x4x2x3xf32>, tensor<2x4x2xf32>, tensor<2xf32>, tensor<2x4x1x4xf32>, tensor<2x2x3x4xf32>) -> tensor<2x4x2x3xf32>
// CORRECT-NOT: model.ssd_scan
// RESCAN: %[[Y:.+]], %{{.+}} = model.ssd_scan %[[X]], %[[DT]], {{.+}} init %[[IN]] {chunk_size = 4 : i64}
// CHECK: %[[OUT:.+]] = model.reshape %[[Y]] : tensor<2x4x2x3xf32> -> tensor<1x8x2x3xf32>
// CHECK: return %[[OUT]]
// An unknown method or strategy is refused by the option's parser, which names the valid ones.
// BADINCOMING: for the --incoming option: unknown value 'twice'; expected correct or rescan
// BADSTRATEGY: for the --strategy option: unknown value 'ring'; expected auto, allgather or chain
module attributes {dist.sequence = #dist.sequence<zigzag, cp = 2, seq = 16>} {
func.func @scan(%x: tensor<1x8x2x3xf32>, %dt: tensor<1x8x2xf32>, %A: tensor<2xf32>, %B: tensor<1x8x1x4xf32>, %D: tensor<2xf32>) -> tensor<1x8x2x3xf32> {
  %y, %f = model.ssd_scan %x, %dt, %A, %B, %B, %D {chunk_size = 4 : i64} : (tensor<1x8x2x3xf32>, tensor<1x8x2xf32>, tensor<2xf32>, tensor<1x8x1x4xf32>, tensor<1x8x1x4xf32>, tensor<2xf32>) -> (tensor<1x8x2x3xf32>, tensor<1x2x3x4xf32>)
  return %y : tensor<1x8x2x3xf32>
}
}

// -----

// Auto picks the chain beyond one NVLink domain (more than 8 ranks).
// AUTO-LABEL: func.func @many_ranks
// AUTO: dist.state_scan {{.+}} strategy = #dist.strategy<chain>
module attributes {dist.sequence = #dist.sequence<contiguous, cp = 16, seq = 256>} {
func.func @many_ranks(%x: tensor<1x16x2x3xf32>, %dt: tensor<1x16x2xf32>, %A: tensor<2xf32>, %B: tensor<1x16x1x4xf32>, %D: tensor<2xf32>) -> tensor<1x16x2x3xf32> {
  %y, %f = model.ssd_scan %x, %dt, %A, %B, %B, %D {chunk_size = 4 : i64} : (tensor<1x16x2x3xf32>, tensor<1x16x2xf32>, tensor<2xf32>, tensor<1x16x1x4xf32>, tensor<1x16x1x4xf32>, tensor<2xf32>) -> (tensor<1x16x2x3xf32>, tensor<1x2x3x4xf32>)
  return %y : tensor<1x16x2x3xf32>
}
}

// -----

// The global final state exists only on the last rank: a program that reads it cannot be split.
module attributes {dist.sequence = #dist.sequence<contiguous, cp = 2, seq = 16>} {
func.func @final_state(%x: tensor<1x8x2x3xf32>, %dt: tensor<1x8x2xf32>, %A: tensor<2xf32>, %B: tensor<1x8x1x4xf32>, %D: tensor<2xf32>) -> tensor<1x2x3x4xf32> {
  // expected-error @+1 {{the final state of a scan split over ranks is only on the last rank}}
  %y, %f = model.ssd_scan %x, %dt, %A, %B, %B, %D {chunk_size = 4 : i64} : (tensor<1x8x2x3xf32>, tensor<1x8x2xf32>, tensor<2xf32>, tensor<1x8x1x4xf32>, tensor<1x8x1x4xf32>, tensor<2xf32>) -> (tensor<1x8x2x3xf32>, tensor<1x2x3x4xf32>)
  return %f : tensor<1x2x3x4xf32>
}
}

// -----

// Scans already split are left as they are: one whose summary is model.ssd_final_state, and one
// whose summary is a full scan handing its final state to dist.state_scan (the scan from zero
// of incoming=correct); both rescans take their initial state from dist.state_scan.
// CHECK-LABEL: func.func @already_split
// CHECK-NEXT: model.ssd_final_state
// CHECK-NEXT: model.ssd_log_decay
// CHECK-NEXT: dist.state_scan
// CHECK-NEXT: model.ssd_scan {{.+}} init
// CHECK-NEXT: model.ssd_scan
// CHECK-NEXT: model.ssd_log_decay
// CHECK-NEXT: dist.state_scan
// CHECK-NEXT: model.ssd_scan {{.+}} init
// CHECK-NEXT: return
module attributes {dist.sequence = #dist.sequence<contiguous, cp = 2, seq = 16>} {
func.func @already_split(%x: tensor<1x8x2x3xf32>, %dt: tensor<1x8x2xf32>, %A: tensor<2xf32>, %B: tensor<1x8x1x4xf32>, %D: tensor<2xf32>) -> (tensor<1x8x2x3xf32>, tensor<1x8x2x3xf32>) {
  %s1 = model.ssd_final_state %x, %dt, %A, %B {chunk_size = 4 : i64} : (tensor<1x8x2x3xf32>, tensor<1x8x2xf32>, tensor<2xf32>, tensor<1x8x1x4xf32>) -> tensor<1x2x3x4xf32>
  %g1 = model.ssd_log_decay %dt, %A : (tensor<1x8x2xf32>, tensor<2xf32>) -> tensor<1x2xf32>
  %in1 = dist.state_scan %g1, %s1 {layout = #dist.sequence<contiguous, cp = 2, seq = 16>, strategy = #dist.strategy<chain>} : (tensor<1x2xf32>, tensor<1x2x3x4xf32>) -> tensor<1x2x3x4xf32>
  %y1, %f1 = model.ssd_scan %x, %dt, %A, %B, %B, %D init %in1 {chunk_size = 4 : i64} : (tensor<1x8x2x3xf32>, tensor<1x8x2xf32>, tensor<2xf32>, tensor<1x8x1x4xf32>, tensor<1x8x1x4xf32>, tensor<2xf32>, tensor<1x2x3x4xf32>) -> (tensor<1x8x2x3xf32>, tensor<1x2x3x4xf32>)
  %y0, %s2 = model.ssd_scan %x, %dt, %A, %B, %B, %D {chunk_size = 4 : i64} : (tensor<1x8x2x3xf32>, tensor<1x8x2xf32>, tensor<2xf32>, tensor<1x8x1x4xf32>, tensor<1x8x1x4xf32>, tensor<2xf32>) -> (tensor<1x8x2x3xf32>, tensor<1x2x3x4xf32>)
  %g2 = model.ssd_log_decay %dt, %A : (tensor<1x8x2xf32>, tensor<2xf32>) -> tensor<1x2xf32>
  %in2 = dist.state_scan %g2, %s2 {layout = #dist.sequence<contiguous, cp = 2, seq = 16>, strategy = #dist.strategy<chain>} : (tensor<1x2xf32>, tensor<1x2x3x4xf32>) -> tensor<1x2x3x4xf32>
  %y2, %f2 = model.ssd_scan %x, %dt, %A, %B, %B, %D init %in2 {chunk_size = 4 : i64} : (tensor<1x8x2x3xf32>, tensor<1x8x2xf32>, tensor<2xf32>, tensor<1x8x1x4xf32>, tensor<1x8x1x4xf32>, tensor<2xf32>, tensor<1x2x3x4xf32>) -> (tensor<1x8x2x3xf32>, tensor<1x2x3x4xf32>)
  return %y1, %y2 : tensor<1x8x2x3xf32>, tensor<1x8x2x3xf32>
}
}
