// hcp-slice-gemms: a GEMM whose product is only cut into column blocks computes each block as a
// GEMM of its own; a gradient assembled from column blocks feeds the GEMMs that read it block
// by block. Mamba's in_proj is the case: z, xBC and dt are column blocks of one product, and
// their gradients are put together again for the projection's backward.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "dialects/exec/ExecOps.h"
#include "llvm/ADT/DenseSet.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "passes/lowering/ExecBuffers.h"
#include "passes/lowering/LaunchArgs.h"
#include "passes/lowering/Passes.h"

namespace hcp {

#define GEN_PASS_DEF_SLICEGEMMS
#include "passes/lowering/Passes.h.inc"

namespace {

using namespace mlir;

using GemmArgs = plan::GemmArgs<Value>;
using GemmAddArgs = plan::GemmAddArgs<Value>;
using SliceArgs = plan::SliceColumnsArgs<Value>;
using InsertArgs = plan::InsertColumnsArgs<Value>;

// Rows [first, first + count) of `matrix`, a row-major buffer of rows of `width` elements.
Value rowsOf(OpBuilder& b, Location loc, Value matrix, int64_t first, int64_t count,
             int64_t width) {
  auto type = MemRefType::get({count, width}, cast<MemRefType>(matrix.getType()).getElementType());
  return exec::ViewOp::create(b, loc, type, matrix, b.getI64IntegerAttr(first * width));
}

// --- the forward: a product read only by column slices ------------------------------------------

// y = a b^T (b a weight [n, k], whose rows are y's columns) read only by slice_columns launches
// of whole rows: each slice becomes a GEMM with b's rows, at the product's place.
struct SlicedProduct {
  exec::LaunchOp gemm;
  GemmArgs args;
  std::vector<exec::LaunchOp> slices;
};

std::optional<SlicedProduct> slicedProduct(exec::LaunchOp launch, const Accesses& accesses) {
  std::optional<GemmArgs> gemm = decodeLaunch<plan::GemmArgs>(launch);
  if (!gemm || !gemm->trans_b) return std::nullopt;
  exec::BufferOp product = rootOf(gemm->c);
  if (!product || elementsOf(product.getResult()) != gemm->m * gemm->n) return std::nullopt;
  SlicedProduct sliced{launch, *gemm, accesses.onlyReaders(gemm->c, launch)};
  if (sliced.slices.empty()) return std::nullopt;
  const int64_t at = accesses.position(launch);
  for (exec::LaunchOp reader : sliced.slices) {
    std::optional<SliceArgs> slice = decodeLaunch<plan::SliceColumnsArgs>(reader);
    if (!slice || slice->rows != gemm->m || slice->in_cols != gemm->n) return std::nullopt;
    // The slice's output is written earlier now: nothing may touch it in between, and it is
    // none of the GEMM's operands.
    if (accesses.touchedBetween(slice->out, at, accesses.position(reader), /*any=*/true))
      return std::nullopt;
    exec::BufferOp out = rootOf(slice->out);
    if (!out || out == rootOf(gemm->a) || out == rootOf(gemm->b)) return std::nullopt;
  }
  return sliced;
}

void computeSlices(SlicedProduct sliced, Accesses& accesses) {
  OpBuilder b(sliced.gemm);
  const Location loc = sliced.gemm.getLoc();
  for (exec::LaunchOp reader : sliced.slices) {
    SliceArgs slice = *decodeLaunch<plan::SliceColumnsArgs>(reader);
    accesses.defineBefore(slice.out, sliced.gemm);
    b.setInsertionPoint(sliced.gemm);
    GemmArgs piece = sliced.args;
    piece.n = slice.width;
    piece.b = rowsOf(b, loc, sliced.args.b, slice.offset, slice.width, sliced.args.k);
    piece.c = slice.out;
    createLaunch(b, loc, piece);
    accesses.forget(reader);
    reader.erase();
  }
  accesses.forget(sliced.gemm);
  sliced.gemm.erase();
}

// --- the backward: a gradient put together from column blocks -----------------------------------

// dy [rows, n], written only by insert_columns launches that fill its columns exactly once, then
// read only as the left operand of GEMMs: dy w (w [n, n_out], whose rows are dy's columns) or
// dy^T x (whose output's rows are). Each GEMM runs block by block on the inserted blocks.
struct AssembledGradient {
  std::vector<exec::LaunchOp> inserts;  // by column offset
  std::vector<Product> readers;
};

std::optional<AssembledGradient> assembledGradient(exec::LaunchOp launch,
                                                   const Accesses& accesses) {
  std::optional<InsertArgs> first = decodeLaunch<plan::InsertColumnsArgs>(launch);
  if (!first) return std::nullopt;
  exec::BufferOp gradient = rootOf(first->out);
  if (!gradient || gradient.getArena() != exec::Arena::Activations) return std::nullopt;
  const int64_t rows = first->rows, cols = first->out_cols;
  if (elementsOf(gradient) != rows * cols) return std::nullopt;
  std::vector<Accesses::Touch> touches = accesses.touches(first->out);
  if (touches.empty() || touches.front().op != launch.getOperation()) return std::nullopt;

  AssembledGradient assembled;
  size_t t = 0;
  for (; t < touches.size() && touches[t].write; ++t) {
    auto insertLaunch = dyn_cast<exec::LaunchOp>(touches[t].op);
    std::optional<InsertArgs> insert = decodeLaunch<plan::InsertColumnsArgs>(insertLaunch);
    if (!insert || insert->rows != rows || insert->out_cols != cols) return std::nullopt;
    if (rootOf(insert->in) == gradient) return std::nullopt;
    assembled.inserts.push_back(insertLaunch);
  }
  for (; t < touches.size(); ++t) {
    auto readerLaunch = dyn_cast<exec::LaunchOp>(touches[t].op);
    std::optional<Product> reader = productOf(readerLaunch);
    if (touches[t].write || !reader) return std::nullopt;
    const GemmAddArgs& args = reader->args;
    if (rootOf(args.a) != gradient || rootOf(args.b) == gradient) return std::nullopt;
    if (args.c && rootOf(args.c) == gradient) return std::nullopt;
    const bool blocksOfK = !args.trans_a && !args.trans_b && args.m == rows && args.k == cols;
    const bool blocksOfM = args.trans_a && args.m == cols && args.k == rows;
    if (!blocksOfK && !blocksOfM) return std::nullopt;
    // (A GEMM reading dy twice is one reader: it reads it as a only, checked above.)
    if (assembled.readers.empty() || assembled.readers.back().launch != readerLaunch)
      assembled.readers.push_back(*reader);
  }
  if (assembled.readers.empty()) return std::nullopt;

  // The blocks fill the columns once, and each still holds at every reader what was inserted.
  auto offsetOf = [](exec::LaunchOp insert) {
    return decodeLaunch<plan::InsertColumnsArgs>(insert)->offset;
  };
  std::sort(assembled.inserts.begin(), assembled.inserts.end(),
            [&](exec::LaunchOp x, exec::LaunchOp y) { return offsetOf(x) < offsetOf(y); });
  int64_t covered = 0;
  for (exec::LaunchOp insertLaunch : assembled.inserts) {
    InsertArgs insert = *decodeLaunch<plan::InsertColumnsArgs>(insertLaunch);
    if (insert.offset != covered) return std::nullopt;
    covered += insert.width;
    for (const Product& reader : assembled.readers) {
      if (accesses.touchedBetween(insert.in, accesses.position(insertLaunch) + 1,
                                  accesses.position(reader.launch), /*any=*/false))
        return std::nullopt;
      const exec::BufferOp block = rootOf(insert.in);
      if (block == rootOf(reader.args.out)) return std::nullopt;
    }
  }
  if (covered != cols) return std::nullopt;
  return assembled;
}

// dx = dy w as the sum over blocks of dy_i w_i (w_i: w's rows of block i), each product added
// to the ones before (and to the reader's addend) by a gemm_add; the partial sums are
// activations of dx's shape, the last sum is dx.
void sumOverBlocks(Product reader, const std::vector<InsertArgs>& blocks) {
  OpBuilder b(reader.launch);
  const Location loc = reader.launch.getLoc();
  const GemmAddArgs& whole = reader.args;
  exec::BufferOp out = rootOf(whole.out);
  const std::string name = (out ? out.getName().str() : std::string("dx")) + ".partial";
  Value sum = whole.c;
  for (size_t i = 0; i < blocks.size(); ++i) {
    GemmAddArgs piece = whole;
    piece.k = blocks[i].width;
    piece.a = blocks[i].in;
    piece.b = rowsOf(b, loc, whole.b, blocks[i].offset, blocks[i].width, whole.n);
    piece.c = sum;
    if (i > 0) piece.beta = 1.0;  // the partial sums are added as they are; beta scaled whole.c
    piece.out = whole.out;
    if (i + 1 < blocks.size()) {
      piece.out =
          exec::BufferOp::create(b, loc, cast<MemRefType>(whole.out.getType()),
                                 exec::ArenaAttr::get(b.getContext(), exec::Arena::Activations),
                                 b.getStringAttr(name + std::to_string(i)), IntegerAttr(),
                                 exec::ParamInitAttr(), FloatAttr(), IntegerAttr());
    }
    launchProduct(b, loc, piece);
    sum = piece.out;
  }
}

// dw = dy^T x block by block: block i's product is dw's rows of block i (and adds to the
// addend's rows of it).
void rowsByBlocks(Product reader, const std::vector<InsertArgs>& blocks) {
  OpBuilder b(reader.launch);
  const Location loc = reader.launch.getLoc();
  const GemmAddArgs& whole = reader.args;
  for (const InsertArgs& block : blocks) {
    GemmAddArgs piece = whole;
    piece.m = block.width;
    piece.a = block.in;
    piece.out = rowsOf(b, loc, whole.out, block.offset, block.width, whole.n);
    if (whole.c) piece.c = rowsOf(b, loc, whole.c, block.offset, block.width, whole.n);
    launchProduct(b, loc, piece);
  }
}

void readByBlocks(AssembledGradient assembled, Accesses& accesses) {
  std::vector<InsertArgs> blocks;
  for (exec::LaunchOp insert : assembled.inserts)
    blocks.push_back(*decodeLaunch<plan::InsertColumnsArgs>(insert));
  for (Product& reader : assembled.readers) {
    for (const InsertArgs& block : blocks) accesses.defineBefore(block.in, reader.launch);
    if (!reader.args.trans_a) {
      sumOverBlocks(reader, blocks);
    } else {
      rowsByBlocks(reader, blocks);
    }
  }
  for (Product& reader : assembled.readers) {
    accesses.forget(reader.launch);
    reader.launch.erase();
  }
  for (exec::LaunchOp insert : assembled.inserts) {
    accesses.forget(insert);
    insert.erase();
  }
}

struct SliceGemmsPass : impl::SliceGemmsBase<SliceGemmsPass> {
  void runOnOperation() override {
    for (auto func : getOperation().getOps<func::FuncOp>()) sliceFunction(func);
  }

  // Every rewrite is found on the step as it was, then made: the two kinds touch different
  // launches (a launch taken by one is not offered to another).
  void sliceFunction(func::FuncOp func) {
    Accesses accesses(func);
    std::vector<SlicedProduct> forward;
    std::vector<AssembledGradient> backward;
    llvm::DenseSet<Operation*> taken;
    auto take = [&](auto launches) {
      for (Operation* op : launches)
        if (taken.contains(op)) return false;
      for (Operation* op : launches) taken.insert(op);
      return true;
    };
    for (int64_t index = 0; index < accesses.size(); ++index) {
      auto launch = dyn_cast_or_null<exec::LaunchOp>(accesses.at(index));
      if (!launch) continue;
      if (std::optional<SlicedProduct> sliced = slicedProduct(launch, accesses)) {
        std::vector<Operation*> ops{sliced->gemm};
        for (exec::LaunchOp slice : sliced->slices) ops.push_back(slice);
        if (take(ops)) forward.push_back(*sliced);
      } else if (std::optional<AssembledGradient> assembled = assembledGradient(launch, accesses)) {
        std::vector<Operation*> ops;
        for (exec::LaunchOp insert : assembled->inserts) ops.push_back(insert);
        for (const Product& reader : assembled->readers) ops.push_back(reader.launch);
        if (take(ops)) backward.push_back(*assembled);
      }
    }
    for (const SlicedProduct& sliced : forward) {
      computeSlices(sliced, accesses);
      ++slicedProducts;
    }
    for (const AssembledGradient& assembled : backward) {
      readByBlocks(assembled, accesses);
      ++assembledGradients;
    }
    eraseDeadBuffers(func);
  }
};

}  // namespace
}  // namespace hcp
