// hcp-lower-to-exec: tensors become buffers, every model op one kernel launch.
#include <string>

#include "dialects/dist/DistOps.h"
#include "dialects/exec/ExecOps.h"
#include "dialects/model/ModelOps.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/TypeSwitch.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "passes/lowering/LaunchArgs.h"
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

// The SSD kernels' shape ints, from x [batch, seq, heads, head_dim] and B or C
// [batch, seq, groups, state].
template <typename Args>
void setSsdShape(Args& args, Value x, Value bOrC) {
  ArrayRef<int64_t> s = shapeOf(x), g = shapeOf(bOrC);
  args.batch = s[0];
  args.seq = s[1];
  args.heads = s[2];
  args.head_dim = s[3];
  args.groups = g[2];
  args.state = g[3];
}

// The attention kernels' shape ints, from q [batch, seq, q_heads, head_dim] and k.
template <typename Args>
void setAttentionShape(Args& args, Value q, Value k) {
  ArrayRef<int64_t> s = shapeOf(q);
  args.batch = s[0];
  args.seq = s[1];
  args.q_heads = s[2];
  args.kv_heads = shapeOf(k)[2];
  args.head_dim = s[3];
}

// The experts kernels' shape ints but `experts` (the local count, or the global one with
// expert parallelism), from x [tokens..., hidden], gates [tokens..., k] and w_in
// [experts, 2*inner, hidden].
template <typename Args>
void setExpertsShape(Args& args, Value x, Value gates, Value wIn) {
  args.tokens = rowsOf(x);
  args.hidden = lastDim(x);
  args.inner = shapeOf(wIn)[1] / 2;
  args.k = lastDim(gates);
}

// The halo exchange's shape ints, from the conv input x [batch * segs, len, channels] and the
// halo [batch * segs, width, channels]: a rank's segments are rows, as many as its layout gives.
template <typename Args>
void setHaloShape(Args& args, Value x, Value halo, dist::SequenceLayoutAttr layout) {
  ArrayRef<int64_t> s = shapeOf(x);
  args.segs = layout.segmentsPerRank();
  args.batch = s[0] / args.segs;
  args.len = s[1];
  args.channels = s[2];
  args.width = shapeOf(halo)[1];
}

// The state scan's ints, from the states s or s_in [batch * segs, heads, head_dim, state], the
// op's layout and its strategy.
template <typename Args, typename Op>
void setStateScanShape(Args& args, Value states, Op op) {
  ArrayRef<int64_t> s = shapeOf(states);
  args.segs = op.getLayout().segmentsPerRank();
  args.batch = s[0] / args.segs;
  args.heads = s[1];
  args.head_dim = s[2];
  args.state = s[3];
  args.strategy = static_cast<int64_t>(op.getStrategy());
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
  Value buffer(exec::Arena arena, StringRef name, Type tensorType, exec::ParamInitAttr init = {},
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
    source_.walk([&](model::ParamGradOp sink) {
      // One buffer per value: a value that is two parameters' gradient gets copied for the second.
      if (!gradientOf_.count(sink.getGrad())) gradientOf_[sink.getGrad()] = sink.getName().str();
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

  template <typename Args>
  void emit(const Args& args) {
    createLaunch(b_, loc_, args);
  }

  // Packed documents: a sequence kernel's positions, when its op has them.
  template <typename Args>
  void setPositions(Args& args, Value positions) {
    args.documents = static_cast<bool>(positions);
    if (positions) args.positions = in(positions);
  }

  // --- ops --------------------------------------------------------------------------------------
  // Each rule fills its kernel's arguments (runtime/plan/KernelTable.txt); the buffers of an
  // op's results are created in result order.
  LogicalResult lower(Operation* op) {
    loc_ = op->getLoc();
    if (auto ret = dyn_cast<func::ReturnOp>(op)) return lowerReturn(ret);
    bool lowered =
        TypeSwitch<Operation*, bool>(op)
            .Case<model::ParamOp, model::ParamGradOp, model::ReshapeOp, model::LinearOp,
                  model::LinearGradInputOp, model::LinearGradWeightOp, model::EmbeddingOp,
                  model::EmbeddingGradOp, model::RmsNormOp, model::RmsNormGradOp,
                  model::GatedRmsNormOp, model::GatedRmsNormGradOp, model::SiluOp,
                  model::SiluGradOp, model::SoftplusOp, model::SoftplusGradOp, model::CastOp,
                  model::NegExpOp, model::NegExpGradOp, model::ScaleOp, model::AddOp, model::MulOp,
                  model::DivOp, model::SwigluOp, model::SwigluGradOp, model::SumLeadingOp,
                  model::FillOp, model::SplitOp, model::ConcatOp, model::CausalConv1dOp,
                  model::CausalConv1dGradOp, model::SsdLogDecayOp, model::SsdLogDecayGradOp,
                  model::SsdScanOp, model::SsdScanGradOp, model::SsdFinalStateOp,
                  model::SsdFinalStateGradOp, model::SsdAddInitialStateOp,
                  model::SsdAddInitialStateGradOp, model::AttentionOp, model::AttentionGradOp,
                  model::MoeRouteOp, model::MoeRouteGradOp, model::MoeExpertsOp,
                  model::MoeExpertsGradOp, model::CrossEntropyOp, model::CrossEntropyGradOp,
                  model::RouterLoadOp, model::RouterLoadGradOp, model::RouterAuxLossOp,
                  model::RouterAuxLossGradOp, model::ReportOp, dist::MoeExpertsOp,
                  dist::MoeExpertsGradOp, dist::HaloExchangeOp, dist::HaloExchangeGradOp,
                  dist::StateScanOp, dist::StateScanGradOp, dist::RingAttentionOp,
                  dist::RingAttentionGradOp, dist::AllReduceOp>([&](auto typed) {
              lowerOp(typed);
              return true;
            })
            .Default([](Operation*) { return false; });
    if (!lowered)
      return op->emitError() << "hcp-lower-to-exec has no kernel for '" << op->getName() << "'";
    return success();
  }

  // The returned value is the loss the runtime reads, unless a model.report names another
  // ("loss" reported beside the load-balancing loss: the return is then their sum, the objective).
  // Results come last: a buffer is kept (hcp-plan-memory) until the last op that reads it.
  LogicalResult lowerReturn(func::ReturnOp ret) {
    if (ret.getNumOperands() != 1)
      return ret.emitError() << "the training step must return exactly the loss";
    if (!llvm::any_of(reported_, [](const auto& r) { return r.first.getValue() == "loss"; }))
      exec::ResultOp::create(b_, loc_, b_.getStringAttr("loss"), in(ret.getOperands().front()));
    for (auto [name, buffer] : reported_) exec::ResultOp::create(b_, loc_, name, buffer);
    return success();
  }

  void lowerOp(model::ReportOp report) {
    reported_.emplace_back(report.getNameAttr(), in(report.getValue()));
  }

  // --- buffers without a launch -----------------------------------------------------------------
  void lowerOp(model::ParamOp param) {
    buffers_[param.getResult()] = buffer(exec::Arena::Parameters, param.getName(), param.getType(),
                                         exec::ParamInitAttr::get(b_.getContext(), param.getInit()),
                                         param.getStdAttr(), param.getShardsAttr());
  }

  // Reshapes are views of the same bytes.
  void lowerOp(model::ReshapeOp reshape) {
    auto tensor = cast<RankedTensorType>(reshape.getResult().getType());
    buffers_[reshape.getResult()] = exec::ViewOp::create(
        b_, loc_, MemRefType::get(tensor.getShape(), tensor.getElementType()), in(reshape.getX()));
  }

  // Already computed into the gradient buffer unless the value was some other gradient too.
  void lowerOp(model::ParamGradOp sink) {
    Value grad = sink.getGrad();
    Value target = gradientBuffer(sink.getName().str(), grad.getType());
    if (in(grad) == target) return;
    plan::CopyArgs<Value> copy;
    copy.n = elementsOf(grad);
    copy.x = in(grad);
    copy.y = target;
    emit(copy);
  }

  // --- linear layers: y[T,N] = x[T,K] W[N,K]^T; dx = dy W; dW = dy^T x ---------------------------
  // The three are one GEMM each, operands in place (the fields in the signature's order: the
  // output buffer is made after the inputs are read, as everywhere here).
  void lowerOp(model::LinearOp op) {
    Value x = op.getX(), w = op.getWeight();
    emit(plan::GemmArgs<Value>{.trans_a = false,
                               .trans_b = true,
                               .m = rowsOf(x),
                               .n = shapeOf(w)[0],
                               .k = shapeOf(w)[1],
                               .alpha = 1.0,
                               .a = in(x),
                               .b = in(w),
                               .c = output(op.getResult())});
  }

  void lowerOp(model::LinearGradInputOp op) {
    Value dy = op.getDy(), w = op.getW();
    emit(plan::GemmArgs<Value>{.trans_a = false,
                               .trans_b = false,
                               .m = rowsOf(dy),
                               .n = shapeOf(w)[1],
                               .k = shapeOf(w)[0],
                               .alpha = 1.0,
                               .a = in(dy),
                               .b = in(w),
                               .c = output(op.getDx())});
  }

  void lowerOp(model::LinearGradWeightOp op) {
    Value dy = op.getDy(), x = op.getX();
    emit(plan::GemmArgs<Value>{.trans_a = true,
                               .trans_b = false,
                               .m = lastDim(dy),
                               .n = lastDim(x),
                               .k = rowsOf(dy),
                               .alpha = 1.0,
                               .a = in(dy),
                               .b = in(x),
                               .c = output(op.getDw())});
  }

  // --- embeddings -------------------------------------------------------------------------------
  void lowerOp(model::EmbeddingOp op) {
    ArrayRef<int64_t> table = shapeOf(op.getTable());
    plan::EmbeddingForwardArgs<Value> embedding;
    embedding.tokens = elementsOf(op.getIds());
    embedding.vocab = table[0];
    embedding.hidden = table[1];
    embedding.multiplier = op.getMultiplier().convertToDouble();
    embedding.table = in(op.getTable());
    embedding.ids = in(op.getIds());
    embedding.out = output(op.getResult());
    emit(embedding);
  }

  void lowerOp(model::EmbeddingGradOp op) {
    ArrayRef<int64_t> table = shapeOf(op.getDtable());
    IntegerAttr padding = op.getPaddingIdxAttr();
    plan::EmbeddingBackwardArgs<Value> embedding;
    embedding.tokens = elementsOf(op.getIds());
    embedding.vocab = table[0];
    embedding.hidden = table[1];
    embedding.padding_idx = padding ? padding.getInt() : -1;
    embedding.multiplier = op.getMultiplier().convertToDouble();
    embedding.dout = in(op.getDy());
    embedding.ids = in(op.getIds());
    embedding.dtable = output(op.getDtable());
    emit(embedding);
  }

  // --- row-wise norms ---------------------------------------------------------------------------
  void lowerOp(model::RmsNormOp op) {
    plan::RmsNormForwardArgs<Value> norm;
    norm.rows = rowsOf(op.getX());
    norm.dim = lastDim(op.getX());
    norm.eps = op.getEps().convertToDouble();
    norm.x = in(op.getX());
    norm.w = in(op.getWeight());
    norm.y = output(op.getResult());
    emit(norm);
  }

  void lowerOp(model::RmsNormGradOp op) {
    plan::RmsNormBackwardArgs<Value> norm;
    norm.rows = rowsOf(op.getDy());
    norm.dim = lastDim(op.getDy());
    norm.eps = op.getEps().convertToDouble();
    norm.dy = in(op.getDy());
    norm.x = in(op.getX());
    norm.w = in(op.getW());
    norm.dx = output(op.getDx());
    norm.dw = output(op.getDw());
    emit(norm);
  }

  void lowerOp(model::GatedRmsNormOp op) {
    plan::GatedRmsNormForwardArgs<Value> norm;
    norm.rows = rowsOf(op.getY());
    norm.dim = lastDim(op.getY());
    norm.eps = op.getEps().convertToDouble();
    norm.y = in(op.getY());
    norm.z = in(op.getGate());
    norm.w = in(op.getWeight());
    norm.out = output(op.getResult());
    emit(norm);
  }

  void lowerOp(model::GatedRmsNormGradOp op) {
    plan::GatedRmsNormBackwardArgs<Value> norm;
    norm.rows = rowsOf(op.getDout());
    norm.dim = lastDim(op.getDout());
    norm.eps = op.getEps().convertToDouble();
    norm.dout = in(op.getDout());
    norm.y = in(op.getY());
    norm.z = in(op.getGate());
    norm.w = in(op.getW());
    norm.dy = output(op.getDy());
    norm.dz = output(op.getDgate());
    norm.dw = output(op.getDw());
    emit(norm);
  }

  // --- elementwise ------------------------------------------------------------------------------
  // y = f(x).
  template <typename Args, typename Op>
  void unary(Op op) {
    Args unary;
    unary.n = elementsOf(op.getResult());
    unary.x = in(op.getX());
    unary.y = output(op.getResult());
    emit(unary);
  }
  void lowerOp(model::SiluOp op) { unary<plan::SiluForwardArgs<Value>>(op); }
  void lowerOp(model::SoftplusOp op) { unary<plan::SoftplusForwardArgs<Value>>(op); }
  void lowerOp(model::NegExpOp op) { unary<plan::NegExpForwardArgs<Value>>(op); }
  void lowerOp(model::CastOp op) { unary<plan::CastArgs<Value>>(op); }

  // dx = dy * f'(x).
  template <typename Args, typename Op>
  void unaryGrad(Op op) {
    Args grad;
    grad.n = elementsOf(op.getDx());
    grad.dy = in(op.getDy());
    grad.x = in(op.getX());
    grad.dx = output(op.getDx());
    emit(grad);
  }
  void lowerOp(model::SiluGradOp op) { unaryGrad<plan::SiluBackwardArgs<Value>>(op); }
  void lowerOp(model::SoftplusGradOp op) { unaryGrad<plan::SoftplusBackwardArgs<Value>>(op); }

  // From the forward's output y, not its input.
  void lowerOp(model::NegExpGradOp op) {
    plan::NegExpBackwardArgs<Value> grad;
    grad.n = elementsOf(op.getDx());
    grad.dy = in(op.getDy());
    grad.y = in(op.getY());
    grad.dx = output(op.getDx());
    emit(grad);
  }

  void lowerOp(model::ScaleOp op) {
    plan::ScaleArgs<Value> scale;
    scale.n = elementsOf(op.getResult());
    scale.factor = op.getFactor().convertToDouble();
    scale.x = in(op.getX());
    scale.y = output(op.getResult());
    emit(scale);
  }

  // y = lhs op rhs, rhs broadcast over the leading dims.
  template <typename Args, typename Op>
  void binary(Op op) {
    Args binary;
    binary.n = elementsOf(op.getLhs());
    binary.rhs_n = elementsOf(op.getRhs());
    binary.a = in(op.getLhs());
    binary.b = in(op.getRhs());
    binary.y = output(op.getResult());
    emit(binary);
  }
  void lowerOp(model::AddOp op) { binary<plan::AddArgs<Value>>(op); }
  void lowerOp(model::MulOp op) { binary<plan::MulArgs<Value>>(op); }
  void lowerOp(model::DivOp op) { binary<plan::DivArgs<Value>>(op); }

  void lowerOp(model::SwigluOp op) {
    Value y = op.getResult();
    plan::SwigluForwardArgs<Value> swiglu;
    swiglu.rows = rowsOf(y);
    swiglu.inner = lastDim(y);
    swiglu.x = in(op.getX());
    swiglu.y = output(y);
    emit(swiglu);
  }

  void lowerOp(model::SwigluGradOp op) {
    Value dy = op.getDy();
    plan::SwigluBackwardArgs<Value> swiglu;
    swiglu.rows = rowsOf(dy);
    swiglu.inner = lastDim(dy);
    swiglu.dy = in(dy);
    swiglu.x = in(op.getX());
    swiglu.dx = output(op.getDx());
    emit(swiglu);
  }

  // --- constants, sums, columns -----------------------------------------------------------------
  void lowerOp(model::SumLeadingOp op) {
    plan::SumLeadingArgs<Value> sum;
    sum.cols = elementsOf(op.getResult());
    sum.rows = elementsOf(op.getX()) / sum.cols;
    sum.x = in(op.getX());
    sum.y = output(op.getResult());
    emit(sum);
  }

  void lowerOp(model::FillOp op) {
    plan::FillArgs<Value> fill;
    fill.n = elementsOf(op.getResult());
    fill.value = op.getValue().convertToDouble();
    fill.y = output(op.getResult());
    emit(fill);
  }

  void lowerOp(model::SplitOp op) {
    Value x = op.getX();
    int64_t offset = 0;
    for (Value piece : op.getPieces()) {
      plan::SliceColumnsArgs<Value> slice;
      slice.rows = rowsOf(x);
      slice.in_cols = lastDim(x);
      slice.offset = offset;
      slice.width = lastDim(piece);
      slice.in = in(x);
      slice.out = output(piece);
      emit(slice);
      offset += slice.width;
    }
  }

  void lowerOp(model::ConcatOp op) {
    Value result = op.getResult();
    Value memref = output(result);
    int64_t offset = 0;
    for (Value piece : op.getPieces()) {
      plan::InsertColumnsArgs<Value> insert;
      insert.rows = rowsOf(result);
      insert.out_cols = lastDim(result);
      insert.offset = offset;
      insert.width = lastDim(piece);
      insert.in = in(piece);
      insert.out = memref;
      emit(insert);
      offset += insert.width;
    }
  }

  // --- Mamba2 mixer -----------------------------------------------------------------------------
  // The SiLU after the conv stays a launch of its own (silu false): hcp-fuse-conv-silu, with
  // --fuse-conv-silu, folds it in. The weight is [channels, 1, width].
  void lowerOp(model::CausalConv1dOp op) {
    ArrayRef<int64_t> x = shapeOf(op.getX());
    plan::CausalConv1dForwardArgs<Value> conv;
    conv.batch = x[0];
    conv.seq = x[1];
    conv.channels = x[2];
    conv.width = shapeOf(op.getWeight())[2];
    conv.has_halo = static_cast<bool>(op.getHalo());
    conv.silu = false;
    conv.x = in(op.getX());
    conv.w = in(op.getWeight());
    conv.bias = in(op.getBias());
    if (conv.has_halo) conv.halo = in(op.getHalo());
    conv.y = output(op.getResult());
    setPositions(conv, op.getPositions());
    emit(conv);
  }

  void lowerOp(model::CausalConv1dGradOp op) {
    ArrayRef<int64_t> x = shapeOf(op.getX());
    plan::CausalConv1dBackwardArgs<Value> conv;
    conv.batch = x[0];
    conv.seq = x[1];
    conv.channels = x[2];
    conv.width = shapeOf(op.getW())[2];
    conv.has_halo = static_cast<bool>(op.getHalo());
    conv.silu = false;
    conv.dy = in(op.getDy());
    conv.x = in(op.getX());
    conv.w = in(op.getW());
    if (conv.has_halo) conv.halo = in(op.getHalo());
    conv.dx = output(op.getDx());
    conv.dw = output(op.getDw());
    conv.dbias = output(op.getDbias());
    if (conv.has_halo) conv.dhalo = output(op.getDhalo());
    setPositions(conv, op.getPositions());
    emit(conv);
  }

  void lowerOp(model::SsdLogDecayOp op) {
    ArrayRef<int64_t> dt = shapeOf(op.getDt());
    plan::SsdLogDecayForwardArgs<Value> decay;
    decay.batch = dt[0];
    decay.seq = dt[1];
    decay.heads = dt[2];
    decay.dt = in(op.getDt());
    decay.A = in(op.getA());
    decay.g = output(op.getG());
    setPositions(decay, op.getPositions());
    emit(decay);
  }

  void lowerOp(model::SsdLogDecayGradOp op) {
    ArrayRef<int64_t> dt = shapeOf(op.getDt());
    plan::SsdLogDecayBackwardArgs<Value> decay;
    decay.batch = dt[0];
    decay.seq = dt[1];
    decay.heads = dt[2];
    decay.dg = in(op.getDg());
    decay.dt = in(op.getDt());
    decay.A = in(op.getA());
    decay.ddt = output(op.getDdt());
    decay.dA = output(op.getDA());
    emit(decay);
  }

  void lowerOp(model::SsdScanOp op) {
    plan::SsdScanForwardArgs<Value> scan;
    setSsdShape(scan, op.getX(), op.getB());
    scan.chunk = op.getChunkSize();
    scan.has_init = static_cast<bool>(op.getInitState());
    scan.x = in(op.getX());
    scan.dt = in(op.getDt());
    scan.A = in(op.getA());
    scan.B = in(op.getB());
    scan.C = in(op.getC());
    scan.D = in(op.getD());
    if (scan.has_init) scan.init_state = in(op.getInitState());
    scan.y = output(op.getY());
    scan.final_state = output(op.getFinalState());
    setPositions(scan, op.getPositions());
    emit(scan);
  }

  // dinit is a result exactly when init_state is an operand (the op's verifier).
  void lowerOp(model::SsdScanGradOp op) {
    plan::SsdScanBackwardArgs<Value> scan;
    setSsdShape(scan, op.getX(), op.getB());
    scan.chunk = op.getChunkSize();
    scan.has_init = static_cast<bool>(op.getInitState());
    scan.has_dfinal = static_cast<bool>(op.getDfinal());
    scan.dy = in(op.getDy());
    scan.x = in(op.getX());
    scan.dt = in(op.getDt());
    scan.A = in(op.getA());
    scan.B = in(op.getB());
    scan.C = in(op.getC());
    scan.D = in(op.getD());
    if (scan.has_init) scan.init_state = in(op.getInitState());
    if (scan.has_dfinal) scan.dfinal_state = in(op.getDfinal());
    scan.dx = output(op.getDx());
    scan.ddt = output(op.getDdt());
    scan.dA = output(op.getDA());
    scan.dB = output(op.getDB());
    scan.dC = output(op.getDC());
    scan.dD = output(op.getDD());
    if (scan.has_init) scan.dinit_state = output(op.getDinit());
    setPositions(scan, op.getPositions());
    emit(scan);
  }

  void lowerOp(model::SsdFinalStateOp op) {
    plan::SsdFinalStateForwardArgs<Value> summary;
    setSsdShape(summary, op.getX(), op.getB());
    summary.chunk = op.getChunkSize();
    summary.x = in(op.getX());
    summary.dt = in(op.getDt());
    summary.A = in(op.getA());
    summary.B = in(op.getB());
    summary.final_state = output(op.getFinalState());
    setPositions(summary, op.getPositions());
    emit(summary);
  }

  void lowerOp(model::SsdFinalStateGradOp op) {
    plan::SsdFinalStateBackwardArgs<Value> summary;
    setSsdShape(summary, op.getX(), op.getB());
    summary.chunk = op.getChunkSize();
    summary.dfinal_state = in(op.getDfinal());
    summary.x = in(op.getX());
    summary.dt = in(op.getDt());
    summary.A = in(op.getA());
    summary.B = in(op.getB());
    summary.dx = output(op.getDx());
    summary.ddt = output(op.getDdt());
    summary.dA = output(op.getDA());
    summary.dB = output(op.getDB());
    setPositions(summary, op.getPositions());
    emit(summary);
  }

  void lowerOp(model::SsdAddInitialStateOp op) {
    plan::SsdAddInitialStateForwardArgs<Value> correction;
    setSsdShape(correction, op.getY(), op.getC());
    correction.y = in(op.getY());
    correction.dt = in(op.getDt());
    correction.A = in(op.getA());
    correction.C = in(op.getC());
    correction.init_state = in(op.getInitState());
    correction.out = output(op.getResult());
    setPositions(correction, op.getPositions());
    emit(correction);
  }

  void lowerOp(model::SsdAddInitialStateGradOp op) {
    plan::SsdAddInitialStateBackwardArgs<Value> correction;
    setSsdShape(correction, op.getDresult(), op.getC());
    correction.dout = in(op.getDresult());
    correction.dt = in(op.getDt());
    correction.A = in(op.getA());
    correction.C = in(op.getC());
    correction.init_state = in(op.getInitState());
    correction.ddt = output(op.getDdt());
    correction.dA = output(op.getDA());
    correction.dC = output(op.getDC());
    correction.dinit_state = output(op.getDinit());
    setPositions(correction, op.getPositions());
    emit(correction);
  }

  // --- attention --------------------------------------------------------------------------------
  // The same arguments for the local attention and the ring attention of context parallelism.
  template <typename Args, typename Op>
  void attention(Op op) {
    Args attention;
    setAttentionShape(attention, op.getQ(), op.getK());
    attention.causal = op.getCausal();
    attention.scale = op.getScale().convertToDouble();
    attention.q = in(op.getQ());
    attention.k = in(op.getK());
    attention.v = in(op.getV());
    attention.out = output(op.getOut());
    attention.lse = output(op.getLse());
    setPositions(attention, op.getPositions());
    emit(attention);
  }
  void lowerOp(model::AttentionOp op) { attention<plan::AttentionForwardArgs<Value>>(op); }
  void lowerOp(dist::RingAttentionOp op) { attention<plan::RingAttentionForwardArgs<Value>>(op); }

  template <typename Args, typename Op>
  void attentionGrad(Op op) {
    Args attention;
    setAttentionShape(attention, op.getQ(), op.getK());
    attention.causal = op.getCausal();
    attention.scale = op.getScale().convertToDouble();
    attention.dout = in(op.getDout());
    attention.q = in(op.getQ());
    attention.k = in(op.getK());
    attention.v = in(op.getV());
    attention.out = in(op.getOut());
    attention.lse = in(op.getLse());
    attention.dq = output(op.getDq());
    attention.dk = output(op.getDk());
    attention.dv = output(op.getDv());
    setPositions(attention, op.getPositions());
    emit(attention);
  }
  void lowerOp(model::AttentionGradOp op) { attentionGrad<plan::AttentionBackwardArgs<Value>>(op); }
  void lowerOp(dist::RingAttentionGradOp op) {
    attentionGrad<plan::RingAttentionBackwardArgs<Value>>(op);
  }

  // --- mixture of experts -----------------------------------------------------------------------
  void lowerOp(model::MoeRouteOp op) {
    Value logits = op.getLogits();
    plan::MoeRouteForwardArgs<Value> route;
    route.tokens = rowsOf(logits);
    route.experts = lastDim(logits);
    route.k = op.getTopK();
    route.logits = in(logits);
    route.gates = output(op.getGates());
    route.expert_ids = output(op.getExperts());
    emit(route);
  }

  void lowerOp(model::MoeRouteGradOp op) {
    Value gates = op.getGates();
    plan::MoeRouteBackwardArgs<Value> route;
    route.tokens = rowsOf(gates);
    route.experts = lastDim(op.getDlogits());
    route.k = lastDim(gates);
    route.dgates = in(op.getDgates());
    route.gates = in(gates);
    route.expert_ids = in(op.getExperts());
    route.dlogits = output(op.getDlogits());
    emit(route);
  }

  // keep_h false: hcp-keep-expert-h sets it.
  void lowerOp(model::MoeExpertsOp op) {
    plan::MoeExpertsForwardArgs<Value> experts;
    setExpertsShape(experts, op.getX(), op.getGates(), op.getInputWeight());
    experts.experts = shapeOf(op.getInputWeight())[0];
    experts.keep_h = false;
    experts.x = in(op.getX());
    experts.gates = in(op.getGates());
    experts.expert_ids = in(op.getExperts());
    experts.w_in = in(op.getInputWeight());
    experts.w_out = in(op.getOutputWeight());
    experts.out = output(op.getResult());
    emit(experts);
  }

  void lowerOp(model::MoeExpertsGradOp op) {
    plan::MoeExpertsBackwardArgs<Value> experts;
    setExpertsShape(experts, op.getX(), op.getGates(), op.getWIn());
    experts.experts = shapeOf(op.getWIn())[0];
    experts.keep_h = false;
    experts.dout_scale = 1.0;
    experts.dout = in(op.getDout());
    experts.x = in(op.getX());
    experts.gates = in(op.getGates());
    experts.expert_ids = in(op.getExperts());
    experts.w_in = in(op.getWIn());
    experts.w_out = in(op.getWOut());
    experts.dx = output(op.getDx());
    experts.dgates = output(op.getDgates());
    experts.dw_in = output(op.getDwIn());
    experts.dw_out = output(op.getDwOut());
    emit(experts);
  }

  // Expert parallelism: the weights are this rank's experts; `experts` is the global count.
  void lowerOp(dist::MoeExpertsOp op) {
    plan::MoeExpertsEpForwardArgs<Value> experts;
    setExpertsShape(experts, op.getX(), op.getGates(), op.getInputWeight());
    experts.experts = op.getNumExperts();
    experts.ep = op.getEp();
    experts.x = in(op.getX());
    experts.gates = in(op.getGates());
    experts.expert_ids = in(op.getExperts());
    experts.w_in = in(op.getInputWeight());
    experts.w_out = in(op.getOutputWeight());
    experts.out = output(op.getResult());
    emit(experts);
  }

  void lowerOp(dist::MoeExpertsGradOp op) {
    plan::MoeExpertsEpBackwardArgs<Value> experts;
    setExpertsShape(experts, op.getX(), op.getGates(), op.getWIn());
    experts.experts = op.getNumExperts();
    experts.ep = op.getEp();
    experts.dout = in(op.getDout());
    experts.x = in(op.getX());
    experts.gates = in(op.getGates());
    experts.expert_ids = in(op.getExperts());
    experts.w_in = in(op.getWIn());
    experts.w_out = in(op.getWOut());
    experts.dx = output(op.getDx());
    experts.dgates = output(op.getDgates());
    experts.dw_in = output(op.getDwIn());
    experts.dw_out = output(op.getDwOut());
    emit(experts);
  }

  // --- loss -------------------------------------------------------------------------------------
  void lowerOp(model::CrossEntropyOp op) {
    Value logits = op.getLogits();
    plan::CrossEntropyForwardArgs<Value> loss;
    loss.tokens = rowsOf(logits);
    loss.vocab = lastDim(logits);
    loss.ignore_index = op.getIgnoreIndexAttr().getInt();
    loss.logits = in(logits);
    loss.targets = in(op.getTargets());
    loss.loss_sum = output(op.getLossSum());
    loss.valid_count = output(op.getValidCount());
    emit(loss);
  }

  void lowerOp(model::CrossEntropyGradOp op) {
    Value logits = op.getLogits();
    plan::CrossEntropyBackwardArgs<Value> loss;
    loss.tokens = rowsOf(logits);
    loss.vocab = lastDim(logits);
    loss.ignore_index = op.getIgnoreIndexAttr().getInt();
    loss.dloss_sum = in(op.getDlossSum());
    loss.logits = in(logits);
    loss.targets = in(op.getTargets());
    loss.dlogits = output(op.getDlogits());
    emit(loss);
  }

  // --- the load-balancing loss ---------------------------------------------------------------
  void lowerOp(model::RouterLoadOp op) {
    Value logits = op.getLogits();
    plan::RouterLoadForwardArgs<Value> load;
    load.tokens = rowsOf(logits);
    load.experts = lastDim(logits);
    load.k = lastDim(op.getExperts());
    load.logits = in(logits);
    load.expert_ids = in(op.getExperts());
    load.probs = output(op.getProbs());
    load.picks = output(op.getPicks());
    emit(load);
  }

  void lowerOp(model::RouterLoadGradOp op) {
    Value logits = op.getLogits();
    plan::RouterLoadBackwardArgs<Value> load;
    load.tokens = rowsOf(logits);
    load.experts = lastDim(logits);
    load.dprobs = in(op.getDprobs());
    load.logits = in(logits);
    load.dlogits = output(op.getDlogits());
    emit(load);
  }

  void lowerOp(model::RouterAuxLossOp op) {
    plan::RouterAuxLossForwardArgs<Value> aux;
    aux.experts = elementsOf(op.getProbs());
    aux.scale = op.getScale().convertToDouble();
    aux.probs = in(op.getProbs());
    aux.picks = in(op.getPicks());
    aux.loss = output(op.getLoss());
    emit(aux);
  }

  void lowerOp(model::RouterAuxLossGradOp op) {
    plan::RouterAuxLossBackwardArgs<Value> aux;
    aux.experts = elementsOf(op.getPicks());
    aux.scale = op.getScale().convertToDouble();
    aux.dloss = in(op.getDloss());
    aux.picks = in(op.getPicks());
    aux.dprobs = output(op.getDprobs());
    emit(aux);
  }

  // --- collectives: the mesh and the rank come from the plan at run time ------------------------
  void lowerOp(dist::HaloExchangeOp op) {
    plan::HaloExchangeForwardArgs<Value> exchange;
    setHaloShape(exchange, op.getX(), op.getHalo(), op.getLayout());
    exchange.x = in(op.getX());
    exchange.halo = output(op.getHalo());
    emit(exchange);
  }

  void lowerOp(dist::HaloExchangeGradOp op) {
    plan::HaloExchangeBackwardArgs<Value> exchange;
    setHaloShape(exchange, op.getDx(), op.getDhalo(), op.getLayout());
    exchange.dhalo = in(op.getDhalo());
    exchange.dx = output(op.getDx());
    emit(exchange);
  }

  void lowerOp(dist::StateScanOp op) {
    plan::StateScanForwardArgs<Value> scan;
    setStateScanShape(scan, op.getS(), op);
    scan.g = in(op.getG());
    scan.s = in(op.getS());
    scan.s_in = output(op.getSIn());
    emit(scan);
  }

  void lowerOp(dist::StateScanGradOp op) {
    plan::StateScanBackwardArgs<Value> scan;
    setStateScanShape(scan, op.getSIn(), op);
    scan.ds_in = in(op.getDsIn());
    scan.g = in(op.getG());
    scan.s_in = in(op.getSIn());
    scan.dg = output(op.getDg());
    scan.ds = output(op.getDs());
    emit(scan);
  }

  void lowerOp(dist::AllReduceOp op) {
    plan::AllReduceArgs<Value> reduce;
    reduce.n = elementsOf(op.getResult());
    reduce.group = static_cast<int64_t>(op.getGroup());
    reduce.x = in(op.getX());
    reduce.y = output(op.getResult());
    emit(reduce);
  }

  func::FuncOp source_;
  OpBuilder b_;
  SmallVector<std::pair<StringAttr, Value>> reported_;  // model.report's, for the end
  Location loc_ = UnknownLoc::get(b_.getContext());
  DenseMap<Value, Value> buffers_;
  DenseMap<Value, std::string> gradientOf_;
  llvm::StringMap<Value> gradients_;
  llvm::StringMap<IntegerAttr> shardsOf_;  // sharded parameters by checkpoint name
  int64_t nextActivation_ = 0;
};

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
