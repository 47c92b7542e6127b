// hcp-lower-to-exec: tensors become buffers, every model op one kernel launch.
#include <functional>
#include <string>

#include "dialects/dist/DistOps.h"
#include "dialects/exec/ExecOps.h"
#include "dialects/model/ModelOps.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/StringMap.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "passes/lowering/Passes.h"

namespace hcp {

#define GEN_PASS_DEF_LOWERTOEXEC
#include "passes/lowering/Passes.h.inc"

namespace {

using namespace mlir;

ArrayRef<int64_t> shapeOf(Value value) { return cast<ShapedType>(value.getType()).getShape(); }
int64_t elementsOf(Value value) { return cast<ShapedType>(value.getType()).getNumElements(); }
int64_t lastDim(Value value) { return shapeOf(value).back(); }
// All dims but the last, multiplied: the "rows" of a row-wise kernel.
int64_t rowsOf(Value value) {
  int64_t last = shapeOf(value).empty() ? 1 : lastDim(value);
  return elementsOf(value) / last;
}
double f64Attr(Operation* op, StringRef name) {
  return op->getAttrOfType<FloatAttr>(name).getValueAsDouble();
}
int64_t i64Attr(Operation* op, StringRef name) {
  return op->getAttrOfType<IntegerAttr>(name).getInt();
}

// Walks the tensor function once, in order, emitting buffers and launches into a new function.
class Lowering {
 public:
  Lowering(func::FuncOp source, func::FuncOp target) : source_(source), b_(target.getContext()) {
    b_.setInsertionPointToStart(&target.getBody().front());
  }

  LogicalResult run() {
    collectGradientSinks();
    for (auto [index, arg] : llvm::enumerate(source_.getArguments())) {
      auto name = source_.getArgAttrOfType<StringAttr>(index, "model.input");
      if (!name)
        return source_.emitError()
               << "argument " << index << " has no model.input name (input_ids or targets)";
      buffers_[arg] = buffer(exec::Arena::Inputs, name.getValue(), arg.getType());
    }
    for (Operation& op : source_.getBody().front()) {
      if (failed(lower(&op))) return failure();
    }
    return success();
  }

 private:
  // --- buffers ----------------------------------------------------------------------------------
  Value buffer(exec::Arena arena, StringRef name, Type tensorType, StringAttr init = {},
               FloatAttr std = {}, IntegerAttr shards = {}) {
    auto tensor = cast<RankedTensorType>(tensorType);
    auto type = MemRefType::get(tensor.getShape(), tensor.getElementType());
    return exec::BufferOp::create(b_, loc_, type, exec::ArenaAttr::get(b_.getContext(), arena),
                                  b_.getStringAttr(name), IntegerAttr(), init, std, shards);
  }

  // A parameter's gradient is written straight into its gradient buffer, which is split like
  // the parameter.
  void collectGradientSinks() {
    source_.walk([&](model::ParamOp param) {
      if (param.getShards()) shardsOf_[param.getName()] = param.getShardsAttr();
    });
    source_.walk([&](Operation* op) {
      if (op->getName().getStringRef() != "model.param_grad") return;
      auto name = op->getAttrOfType<StringAttr>("name");
      Value grad = op->getOperand(0);
      // One buffer per value: a value that is two parameters' gradient gets copied for the second.
      if (!gradientOf_.count(grad)) gradientOf_[grad] = name.getValue().str();
    });
  }

  // The buffer an op result is computed into.
  Value output(Value result) {
    Value memref;
    auto sink = gradientOf_.find(result);
    if (sink != gradientOf_.end()) {
      memref = gradientBuffer(sink->second, result.getType());
    } else {
      memref = buffer(exec::Arena::Activations, "act." + std::to_string(nextActivation_++),
                      result.getType());
    }
    buffers_[result] = memref;
    return memref;
  }

  Value gradientBuffer(const std::string& name, Type type) {
    auto it = gradients_.find(name);
    if (it != gradients_.end()) return it->second;
    Value memref = buffer(exec::Arena::Gradients, name, type, {}, {}, shardsOf_.lookup(name));
    gradients_[name] = memref;
    return memref;
  }

  Value in(Value tensor) { return buffers_.lookup(tensor); }

  void launch(StringRef kernel, ArrayRef<Value> ins, ArrayRef<Value> outs, ArrayRef<int64_t> ints,
              ArrayRef<double> floats = {}) {
    exec::LaunchOp::create(b_, loc_, b_.getStringAttr(kernel), ins, outs,
                           b_.getDenseI64ArrayAttr(ints), b_.getDenseF64ArrayAttr(floats));
  }

  // Lowers an op whose operands map one-to-one to the kernel's inputs and whose results map to
  // its outputs.
  void direct(Operation* op, StringRef kernel, ArrayRef<int64_t> ints,
              ArrayRef<double> floats = {}) {
    SmallVector<Value> ins, outs;
    for (Value operand : op->getOperands()) ins.push_back(in(operand));
    for (Value result : op->getResults()) outs.push_back(output(result));
    launch(kernel, ins, outs, ints, floats);
  }

  // --- ops --------------------------------------------------------------------------------------
  LogicalResult lower(Operation* op) {
    loc_ = op->getLoc();
    StringRef name = op->getName().getStringRef();
    if (auto param = dyn_cast<model::ParamOp>(op)) {
      FloatAttr std = param.getStdAttr();
      buffers_[param.getResult()] = buffer(
          exec::Arena::Parameters, param.getName(), param.getType(),
          b_.getStringAttr(model::stringifyParamInit(param.getInit())), std, param.getShardsAttr());
      return success();
    }
    if (isa<func::ReturnOp>(op)) {
      if (op->getNumOperands() != 1)
        return op->emitError() << "the training step must return exactly the loss";
      Value loss = in(op->getOperand(0));
      exec::ResultOp::create(b_, loc_, b_.getStringAttr("loss"), loss);
      return success();
    }
    if (name == "model.param_grad") {
      // Already computed into the gradient buffer unless the value was some other gradient too.
      std::string param = op->getAttrOfType<StringAttr>("name").getValue().str();
      Value grad = op->getOperand(0);
      Value target = gradientBuffer(param, grad.getType());
      if (in(grad) != target) launch("copy", {in(grad)}, {target}, {elementsOf(grad)});
      return success();
    }
    if (isa<model::ReshapeOp>(op)) {
      Value source = in(op->getOperand(0));
      auto tensor = cast<RankedTensorType>(op->getResult(0).getType());
      buffers_[op->getResult(0)] = exec::ViewOp::create(
          b_, loc_, MemRefType::get(tensor.getShape(), tensor.getElementType()), source);
      return success();
    }
    auto rule = rules().find(name);
    if (rule == rules().end())
      return op->emitError() << "no kernel for '" << name << "' in the CPU kernel set";
    rule->second(*this, op);
    return success();
  }

  using Rule = std::function<void(Lowering&, Operation*)>;
  static const llvm::StringMap<Rule>& rules();

  func::FuncOp source_;
  OpBuilder b_;
  Location loc_ = UnknownLoc::get(b_.getContext());
  DenseMap<Value, Value> buffers_;
  DenseMap<Value, std::string> gradientOf_;
  llvm::StringMap<Value> gradients_;
  llvm::StringMap<IntegerAttr> shardsOf_;  // sharded parameters by checkpoint name
  int64_t nextActivation_ = 0;
};

// The kernel choice and scalar arguments of every op, by op name. Operand and result orders
// follow the op definitions (ModelOps.td, ModelGradOps.td) and KernelTable.def.
const llvm::StringMap<Lowering::Rule>& Lowering::rules() {
  static const llvm::StringMap<Rule> table = [] {
    llvm::StringMap<Rule> r;
    // Linear layers: y[T,N] = x[T,K] W[N,K]^T; dx = dy W; dW = dy^T x.
    r["model.linear"] = [](Lowering& l, Operation* op) {
      Value x = op->getOperand(0), w = op->getOperand(1);
      l.direct(op, "gemm", {0, 1, rowsOf(x), shapeOf(w)[0], shapeOf(w)[1]}, {1.0});
    };
    r["model.linear_grad_input"] = [](Lowering& l, Operation* op) {
      Value dy = op->getOperand(0), w = op->getOperand(1);
      l.direct(op, "gemm", {0, 0, rowsOf(dy), shapeOf(w)[1], shapeOf(w)[0]}, {1.0});
    };
    r["model.linear_grad_weight"] = [](Lowering& l, Operation* op) {
      Value dy = op->getOperand(0), x = op->getOperand(1);
      l.direct(op, "gemm", {1, 0, lastDim(dy), lastDim(x), rowsOf(dy)}, {1.0});
    };
    r["model.embedding"] = [](Lowering& l, Operation* op) {
      Value table = op->getOperand(0), ids = op->getOperand(1);
      l.direct(op, "embedding.forward", {elementsOf(ids), shapeOf(table)[0], shapeOf(table)[1]},
               {f64Attr(op, "multiplier")});
    };
    r["model.embedding_grad"] = [](Lowering& l, Operation* op) {
      Value ids = op->getOperand(1), table = op->getResult(0);
      auto pad = op->getAttrOfType<IntegerAttr>("padding_idx");
      l.direct(op, "embedding.backward",
               {elementsOf(ids), shapeOf(table)[0], shapeOf(table)[1], pad ? pad.getInt() : -1},
               {f64Attr(op, "multiplier")});
    };
    auto rowwise = [](StringRef kernel) {
      return [kernel](Lowering& l, Operation* op) {
        Value x = op->getOperand(0);
        l.direct(op, kernel, {rowsOf(x), lastDim(x)}, {f64Attr(op, "eps")});
      };
    };
    r["model.rms_norm"] = rowwise("rms_norm.forward");
    r["model.rms_norm_grad"] = rowwise("rms_norm.backward");
    r["model.gated_rms_norm"] = rowwise("gated_rms_norm.forward");
    r["model.gated_rms_norm_grad"] = rowwise("gated_rms_norm.backward");
    auto elementwise = [](StringRef kernel) {
      return [kernel](Lowering& l, Operation* op) {
        l.direct(op, kernel, {elementsOf(op->getResult(0))});
      };
    };
    r["model.silu"] = elementwise("silu.forward");
    r["model.silu_grad"] = elementwise("silu.backward");
    r["model.softplus"] = elementwise("softplus.forward");
    r["model.softplus_grad"] = elementwise("softplus.backward");
    r["model.cast"] = elementwise("cast");
    r["model.neg_exp"] = elementwise("neg_exp.forward");
    r["model.neg_exp_grad"] = elementwise("neg_exp.backward");
    r["model.scale"] = [](Lowering& l, Operation* op) {
      l.direct(op, "scale", {elementsOf(op->getResult(0))}, {f64Attr(op, "factor")});
    };
    auto binary = [](StringRef kernel) {
      return [kernel](Lowering& l, Operation* op) {
        l.direct(op, kernel, {elementsOf(op->getOperand(0)), elementsOf(op->getOperand(1))});
      };
    };
    r["model.add"] = binary("add");
    r["model.mul"] = binary("mul");
    r["model.div"] = binary("div");
    r["model.swiglu"] = [](Lowering& l, Operation* op) {
      Value y = op->getResult(0);
      l.direct(op, "swiglu.forward", {rowsOf(y), lastDim(y)});
    };
    r["model.swiglu_grad"] = [](Lowering& l, Operation* op) {
      Value dy = op->getOperand(0);
      l.direct(op, "swiglu.backward", {rowsOf(dy), lastDim(dy)});
    };
    r["model.sum_leading"] = [](Lowering& l, Operation* op) {
      Value x = op->getOperand(0);
      int64_t cols = elementsOf(op->getResult(0));
      l.direct(op, "sum_leading", {elementsOf(x) / cols, cols});
    };
    r["model.fill"] = [](Lowering& l, Operation* op) {
      l.direct(op, "fill", {elementsOf(op->getResult(0))}, {f64Attr(op, "value")});
    };
    r["model.split"] = [](Lowering& l, Operation* op) {
      Value x = op->getOperand(0);
      int64_t offset = 0;
      for (Value piece : op->getResults()) {
        l.launch("slice_columns", {l.in(x)}, {l.output(piece)},
                 {rowsOf(x), lastDim(x), offset, lastDim(piece)});
        offset += lastDim(piece);
      }
    };
    r["model.concat"] = [](Lowering& l, Operation* op) {
      Value out = op->getResult(0);
      Value memref = l.output(out);
      int64_t offset = 0;
      for (Value piece : op->getOperands()) {
        l.launch("insert_columns", {l.in(piece)}, {memref},
                 {rowsOf(out), lastDim(out), offset, lastDim(piece)});
        offset += lastDim(piece);
      }
    };
    // ints: batch, seq, channels, width, has_halo (the halo is the last operand when present),
    // silu (0 here: hcp-fuse-conv-silu, with --fuse-conv-silu, folds the SiLU that follows).
    auto conv = [](StringRef kernel, unsigned xIndex) {
      return [kernel, xIndex](Lowering& l, Operation* op) {
        Value x = op->getOperand(xIndex), w = op->getOperand(xIndex + 1);
        ArrayRef<int64_t> s = shapeOf(x);
        int64_t hasHalo = op->getNumOperands() == 4;  // x, w, bias | dy, x, w; then the halo
        l.direct(op, kernel, {s[0], s[1], s[2], shapeOf(w)[2], hasHalo, 0});
      };
    };
    r["model.causal_conv1d"] = conv("causal_conv1d.forward", 0);
    r["model.causal_conv1d_grad"] = conv("causal_conv1d.backward", 1);
    auto logDecay = [](StringRef kernel, unsigned dtIndex) {
      return [kernel, dtIndex](Lowering& l, Operation* op) {
        ArrayRef<int64_t> s = shapeOf(op->getOperand(dtIndex));
        l.direct(op, kernel, {s[0], s[1], s[2]});
      };
    };
    r["model.ssd_log_decay"] = logDecay("ssd_log_decay.forward", 0);
    r["model.ssd_log_decay_grad"] = logDecay("ssd_log_decay.backward", 1);
    // ints: batch, seq, heads, head_dim, groups, state, chunk, has_init[, has_dfinal].
    r["model.ssd_scan"] = [](Lowering& l, Operation* op) {
      Value x = op->getOperand(0), B = op->getOperand(3);
      ArrayRef<int64_t> s = shapeOf(x);
      int64_t hasInit = op->getNumOperands() == 7;
      l.direct(op, "ssd_scan.forward",
               {s[0], s[1], s[2], s[3], shapeOf(B)[2], shapeOf(B)[3], i64Attr(op, "chunk_size"),
                hasInit});
    };
    r["model.ssd_scan_grad"] = [](Lowering& l, Operation* op) {
      Value x = op->getOperand(1), B = op->getOperand(4);
      ArrayRef<int64_t> s = shapeOf(x);
      // dinit is a result exactly when init is an operand; the rest of the optional operands
      // is dfinal.
      int64_t hasInit = op->getNumResults() == 7;
      int64_t hasDfinal = static_cast<int64_t>(op->getNumOperands()) - 7 - hasInit;
      l.direct(op, "ssd_scan.backward",
               {s[0], s[1], s[2], s[3], shapeOf(B)[2], shapeOf(B)[3], i64Attr(op, "chunk_size"),
                hasInit, hasDfinal});
    };
    // ints: batch, seq, heads, head_dim, groups, state, chunk (x and B are operands 0 and 3 of
    // the forward, 1 and 4 of the gradient, after dfinal).
    auto finalState = [](StringRef kernel, unsigned xIndex) {
      return [kernel, xIndex](Lowering& l, Operation* op) {
        ArrayRef<int64_t> s = shapeOf(op->getOperand(xIndex)),
                          b = shapeOf(op->getOperand(xIndex + 3));
        l.direct(op, kernel, {s[0], s[1], s[2], s[3], b[2], b[3], i64Attr(op, "chunk_size")});
      };
    };
    r["model.ssd_final_state"] = finalState("ssd_final_state.forward", 0);
    r["model.ssd_final_state_grad"] = finalState("ssd_final_state.backward", 1);
    // ints: batch, seq, heads, head_dim, groups, state (y | dresult is operand 0, C operand 3).
    auto initialState = [](StringRef kernel) {
      return [kernel](Lowering& l, Operation* op) {
        ArrayRef<int64_t> s = shapeOf(op->getOperand(0)), c = shapeOf(op->getOperand(3));
        l.direct(op, kernel, {s[0], s[1], s[2], s[3], c[2], c[3]});
      };
    };
    r["model.ssd_add_initial_state"] = initialState("ssd_add_initial_state.forward");
    r["model.ssd_add_initial_state_grad"] = initialState("ssd_add_initial_state.backward");
    auto attention = [](StringRef kernel) {
      return [kernel](Lowering& l, Operation* op) {
        bool forward = kernel == "attention.forward";
        Value q = op->getOperand(forward ? 0 : 1), k = op->getOperand(forward ? 1 : 2);
        ArrayRef<int64_t> s = shapeOf(q);
        int64_t causal = op->hasAttr("causal");
        l.direct(op, kernel, {s[0], s[1], s[2], shapeOf(k)[2], s[3], causal},
                 {f64Attr(op, "scale")});
      };
    };
    r["model.attention"] = attention("attention.forward");
    r["model.attention_grad"] = attention("attention.backward");
    r["model.moe_route"] = [](Lowering& l, Operation* op) {
      Value logits = op->getOperand(0);
      l.direct(op, "moe_route.forward", {rowsOf(logits), lastDim(logits), i64Attr(op, "top_k")});
    };
    r["model.moe_route_grad"] = [](Lowering& l, Operation* op) {
      Value gates = op->getOperand(1), dlogits = op->getResult(0);
      l.direct(op, "moe_route.backward", {rowsOf(gates), lastDim(dlogits), lastDim(gates)});
    };
    // ints: tokens, hidden, inner, experts, k, keep_h (0 here: hcp-keep-expert-h sets it).
    auto experts = [](StringRef kernel) {
      return [kernel](Lowering& l, Operation* op) {
        int first = kernel == "moe_experts.forward" ? 0 : 1;
        Value x = op->getOperand(first), gates = op->getOperand(first + 1);
        Value win = op->getOperand(first + 3);
        ArrayRef<int64_t> w = shapeOf(win);
        l.direct(op, kernel, {rowsOf(x), lastDim(x), w[1] / 2, w[0], lastDim(gates), 0});
      };
    };
    r["model.moe_experts"] = experts("moe_experts.forward");
    r["model.moe_experts_grad"] = experts("moe_experts.backward");
    // Expert parallelism: ints tokens, hidden, inner, experts (global), k, ep.
    auto expertsEp = [](StringRef kernel) {
      return [kernel](Lowering& l, Operation* op) {
        int first = kernel == "moe_experts_ep.forward" ? 0 : 1;
        Value x = op->getOperand(first), gates = op->getOperand(first + 1);
        ArrayRef<int64_t> w = shapeOf(op->getOperand(first + 3));
        l.direct(op, kernel,
                 {rowsOf(x), lastDim(x), w[1] / 2, i64Attr(op, "num_experts"), lastDim(gates),
                  i64Attr(op, "ep")});
      };
    };
    r["dist.moe_experts"] = expertsEp("moe_experts_ep.forward");
    r["dist.moe_experts_grad"] = expertsEp("moe_experts_ep.backward");
    r["model.cross_entropy"] = [](Lowering& l, Operation* op) {
      Value logits = op->getOperand(0);
      l.direct(op, "cross_entropy.forward",
               {rowsOf(logits), lastDim(logits), i64Attr(op, "ignore_index")});
    };
    r["model.cross_entropy_grad"] = [](Lowering& l, Operation* op) {
      Value logits = op->getOperand(1);
      l.direct(op, "cross_entropy.backward",
               {rowsOf(logits), lastDim(logits), i64Attr(op, "ignore_index")});
    };
    // Collectives: the mesh and the rank come from the plan at run time; the segments per rank
    // from the op's layout. Segment-row tensors have batch * segs rows.
    auto segments = [](Operation* op) {
      return op->getAttrOfType<dist::SequenceLayoutAttr>("layout").segmentsPerRank();
    };
    auto halo = [segments](StringRef kernel) {
      return [kernel, segments](Lowering& l, Operation* op) {
        bool forward = kernel == "halo_exchange.forward";
        Value x = forward ? op->getOperand(0) : op->getResult(0);
        Value h = forward ? op->getResult(0) : op->getOperand(0);
        ArrayRef<int64_t> s = shapeOf(x);
        int64_t segs = segments(op);
        l.direct(op, kernel, {s[0] / segs, segs, s[1], s[2], shapeOf(h)[1]});
      };
    };
    r["dist.halo_exchange"] = halo("halo_exchange.forward");
    r["dist.halo_exchange_grad"] = halo("halo_exchange.backward");
    auto stateScan = [segments](StringRef kernel) {
      return [kernel, segments](Lowering& l, Operation* op) {
        ArrayRef<int64_t> s = shapeOf(op->getOperand(kernel == "state_scan.forward" ? 1 : 2));
        int64_t segs = segments(op);
        auto strategy = op->getAttrOfType<dist::StateScanStrategyAttr>("strategy").getValue();
        l.direct(op, kernel, {s[0] / segs, segs, s[1], s[2], s[3], static_cast<int64_t>(strategy)});
      };
    };
    r["dist.state_scan"] = stateScan("state_scan.forward");
    r["dist.state_scan_grad"] = stateScan("state_scan.backward");
    auto ring = [](StringRef kernel) {
      return [kernel](Lowering& l, Operation* op) {
        bool forward = kernel == "ring_attention.forward";
        Value q = op->getOperand(forward ? 0 : 1), k = op->getOperand(forward ? 1 : 2);
        ArrayRef<int64_t> s = shapeOf(q);
        l.direct(op, kernel, {s[0], s[1], s[2], shapeOf(k)[2], s[3], op->hasAttr("causal")},
                 {f64Attr(op, "scale")});
      };
    };
    r["dist.ring_attention"] = ring("ring_attention.forward");
    r["dist.ring_attention_grad"] = ring("ring_attention.backward");
    r["dist.all_reduce"] = [](Lowering& l, Operation* op) {
      auto group = op->getAttrOfType<dist::ReduceGroupAttr>("group").getValue();
      l.direct(op, "all_reduce", {elementsOf(op->getResult(0)), static_cast<int64_t>(group)});
    };
    return r;
  }();
  return table;
}

struct LowerToExecPass : impl::LowerToExecBase<LowerToExecPass> {
  using Base::Base;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    auto source = module.lookupSymbol<func::FuncOp>(function);
    if (!source) {
      module.emitError() << "no function '" << function << "' to lower";
      return signalPassFailure();
    }
    if (!source.getBody().hasOneBlock()) {
      source.emitError() << "the training step must be a single block";
      return signalPassFailure();
    }
    OpBuilder builder(source);
    auto target =
        func::FuncOp::create(builder, source.getLoc(), function, builder.getFunctionType({}, {}));
    Block* body = target.addEntryBlock();
    Lowering lowering(source, target);
    if (failed(lowering.run())) {
      target.erase();
      return signalPassFailure();
    }
    builder.setInsertionPointToEnd(body);
    func::ReturnOp::create(builder, source.getLoc());
    source.erase();
  }
};

}  // namespace
}  // namespace hcp
