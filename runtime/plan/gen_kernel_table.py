#!/usr/bin/env python3
"""Writes KernelTable.gen.h from KernelTable.txt (the format is described at the top of that file).

Usage: gen_kernel_table.py KernelTable.txt OUTPUT.h

The header holds, for every kernel: a KernelId, its KernelSignature (the data the generic checks
read), and a typed argument struct `<Id>Args<Buffer>` whose fields are the signature's ints,
floats and buffers by name, with Decode (from a step's lists) and Encode (to them). Errors in
the description name the file and line.
"""

import re
import sys
from dataclasses import dataclass, field

DTYPES = {"storage": "Storage", "f32": "F32", "i32": "I32"}
INT_KINDS = {"size": "Size", "flag": "Flag", "int": "Int"}
RULES = {
    "range": "Range",
    "divisible": "Divisible",
    "same_dtype": "SameDType",
    "segments_per_rank": "SegmentsPerRank",
    "segment_length": "SegmentLength",
    "local_sequence": "LocalSequence",
    "expert_parallel": "ExpertParallel",
}
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*$")


class DescriptionError(Exception):
    pass


@dataclass
class Buffer:
    name: str
    dtype: str
    shape: list  # of (index, constant, divisor)
    present_if: int = -1
    at_least: bool = False


@dataclass
class Rule:
    kind: str
    a: int = -1
    b: int = -1
    lo: int = 0
    hi: tuple = (-1, -1, 0)
    words: str = ""


@dataclass
class Kernel:
    name: str
    ident: str
    collective: bool
    beside: bool
    doc: list = field(default_factory=list)
    ints: list = field(default_factory=list)  # (name, kind)
    floats: list = field(default_factory=list)
    ins: list = field(default_factory=list)
    outs: list = field(default_factory=list)
    rules: list = field(default_factory=list)

    def int_index(self, name, where):
        for i, (int_name, _) in enumerate(self.ints):
            if int_name == name:
                return i
        raise DescriptionError(f"{where}: '{name}' is not an int of {self.name}")

    def flag_index(self, name, where):
        i = self.int_index(name, where)
        if self.ints[i][1] != "Flag":
            raise DescriptionError(f"{where}: '{name}' is not a flag")
        return i

    def field_names(self):
        return ([n for n, _ in self.ints] + self.floats + [b.name for b in self.ins] +
                [b.name for b in self.outs])


def parse_factor(kernel, text, where):
    text = text.strip()
    if re.fullmatch(r"\d+", text):
        return (-1, int(text), -1)
    m = re.fullmatch(r"(\w+)-(\d+)", text)
    if m:
        return (kernel.int_index(m.group(1), where), -int(m.group(2)), -1)
    m = re.fullmatch(r"(\w+)/(\w+)", text)
    if m:
        return (kernel.int_index(m.group(1), where), 0, kernel.int_index(m.group(2), where))
    m = re.fullmatch(r"ceil\((\w+)/(\w+)\)", text)
    if m:
        return (kernel.int_index(m.group(1), where), 0, kernel.int_index(m.group(2), where), True)
    return (kernel.int_index(text, where), 0, -1)


def parse_bound(kernel, text, where):
    if re.fullmatch(r"-?\d+", text):
        return (-1, -1, int(text))
    m = re.fullmatch(r"(\w+)-(\d+)", text)
    if m:
        return (kernel.int_index(m.group(1), where), -1, -int(m.group(2)))
    m = re.fullmatch(r"(\w+)-(\w+)", text)
    if m:
        return (kernel.int_index(m.group(1), where), kernel.int_index(m.group(2), where), 0)
    return (kernel.int_index(text, where), -1, 0)


def parse_buffer(kernel, rest, where):
    m = re.fullmatch(r"(\w+)\s+(\w+)\s+\[([^\]]*)\]((?:\s+if\s+\w+)?)((?:\s+at_least)?)", rest)
    if not m:
        raise DescriptionError(f"{where}: expected NAME DTYPE [SHAPE] [if FLAG] [at_least]")
    name, dtype, shape, cond, at_least = m.groups()
    if dtype not in DTYPES:
        raise DescriptionError(f"{where}: dtype '{dtype}' is not one of {', '.join(DTYPES)}")
    factors = [parse_factor(kernel, f, where) for f in shape.split(",") if f.strip()]
    if not factors:
        raise DescriptionError(f"{where}: a buffer needs a shape")
    present_if = kernel.flag_index(cond.split()[1], where) if cond.strip() else -1
    return Buffer(name, DTYPES[dtype], factors, present_if, bool(at_least.strip()))


def parse_rule(kernel, rest, where):
    words = ""
    quoted = re.search(r'"([^"]*)"\s*$', rest)
    if quoted:
        words = quoted.group(1)
        rest = rest[:quoted.start()]
    parts = rest.split()
    if not parts or parts[0] not in RULES:
        raise DescriptionError(f"{where}: unknown rule (one of {', '.join(RULES)})")
    kind, args = RULES[parts[0]], parts[1:]
    arity = {"Range": 3, "Divisible": 2, "SameDType": 0, "ExpertParallel": 2}.get(kind, 1)
    if len(args) != arity:
        raise DescriptionError(f"{where}: rule {parts[0]} takes {arity} arguments")
    if kind == "Range":
        return Rule(kind, kernel.int_index(args[0], where), lo=int(args[1]),
                    hi=parse_bound(kernel, args[2], where), words=words or args[2])
    indices = [kernel.int_index(a, where) for a in args]
    return Rule(kind, *(indices + [-1, -1])[:2])


def parse(path):
    kernels, kernel = [], None
    with open(path) as f:
        for number, raw in enumerate(f, 1):
            where = f"{path}:{number}"
            line = raw.rstrip("\n")
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            word, _, rest = line.strip().partition(" ")
            rest = rest.strip()
            if word == "kernel":
                parts = rest.split()
                markers = parts[2:]
                if len(parts) < 2 or markers not in ([], ["collective"], ["collective", "beside"]):
                    raise DescriptionError(
                        f"{where}: expected kernel NAME Id [collective [beside]]")
                if not IDENTIFIER.match(parts[1]):
                    raise DescriptionError(f"{where}: '{parts[1]}' is not a C++ identifier")
                kernel = Kernel(parts[0], parts[1], "collective" in markers, "beside" in markers)
                kernels.append(kernel)
                continue
            if kernel is None:
                raise DescriptionError(f"{where}: '{word}' before the first kernel")
            if word == "doc":
                kernel.doc.append(rest)
            elif word in INT_KINDS:
                if kernel.ins or kernel.outs or kernel.floats:
                    raise DescriptionError(f"{where}: ints come before floats and buffers")
                kernel.ints.append((rest, INT_KINDS[word]))
            elif word == "float":
                kernel.floats.append(rest)
            elif word in ("in", "out"):
                (kernel.ins if word == "in" else kernel.outs).append(
                    parse_buffer(kernel, rest, where))
            elif word == "rule":
                kernel.rules.append(parse_rule(kernel, rest, where))
            else:
                raise DescriptionError(f"{where}: unknown line '{word}'")
    names = set()
    for k in kernels:
        if k.name in names:
            raise DescriptionError(f"{path}: kernel {k.name} appears twice")
        names.add(k.name)
        fields = k.field_names()
        for name in fields:
            if not IDENTIFIER.match(name) or fields.count(name) > 1:
                raise DescriptionError(f"{path}: {k.name}: field '{name}' is not a unique name")
    return kernels


def factor_init(f):
    index, constant, divisor = f[:3]
    ceil = len(f) > 3 and f[3]
    return "{%d, %d, %d, %s}" % (index, constant, divisor, "true" if ceil else "false")


def buffer_init(ident, role, i, b):
    return (f'{{"{b.name}", DTypeRule::{b.dtype}, k{ident}{role}Shape{i}, {b.present_if}, '
            f'{"true" if b.at_least else "false"}}}')


def rule_init(r):
    return (f'{{RuleKind::{r.kind}, {r.a}, {r.b}, {r.lo}, {{{r.hi[0]}, {r.hi[1]}, {r.hi[2]}}}, '
            f'"{r.words}"}}')


def span_of(array, items):
    return array if items else "{}"


def emit_signature(k, out):
    ident = k.ident
    if k.ints:
        specs = ", ".join(f'{{"{n}", IntKind::{kind}}}' for n, kind in k.ints)
        out.append(f"inline constexpr IntSpec k{ident}Ints[] = {{{specs}}};")
    if k.floats:
        names = ", ".join(f'"{n}"' for n in k.floats)
        out.append(f"inline constexpr std::string_view k{ident}Floats[] = {{{names}}};")
    for role, buffers in (("Ins", k.ins), ("Outs", k.outs)):
        for i, b in enumerate(buffers):
            factors = ", ".join(factor_init(f) for f in b.shape)
            out.append(f"inline constexpr Factor k{ident}{role}Shape{i}[] = {{{factors}}};")
        if buffers:
            specs = ",\n    ".join(buffer_init(ident, role, i, b) for i, b in enumerate(buffers))
            out.append(f"inline constexpr BufferSpec k{ident}{role}[] = {{\n    {specs}}};")
    if k.rules:
        specs = ", ".join(rule_init(r) for r in k.rules)
        out.append(f"inline constexpr RuleSpec k{ident}Rules[] = {{{specs}}};")


def cpp_type(kind):
    return "bool" if kind == "Flag" else "int64_t"


def emit_struct(k, out):
    ident = k.ident
    for line in k.doc:
        out.append(f"// {line}".rstrip())
    out.append("template <typename Buffer = uint32_t>")
    out.append(f"struct {ident}Args {{")
    out.append(f"  static constexpr KernelId kId = KernelId::{ident};")
    out.append(f'  static constexpr std::string_view kName = "{k.name}";')
    for name, kind in k.ints:
        out.append(f"  {cpp_type(kind)} {name} = {{}};")
    for name in k.floats:
        out.append(f"  double {name} = 0.0;")
    for role, buffers in (("input", k.ins), ("output", k.outs)):
        for b in buffers:
            cond = f"  // {role}, present iff {k.ints[b.present_if][0]}" if b.present_if >= 0 else ""
            out.append(f"  Buffer {b.name}{{}};{cond}")
    out.append("")
    out.append("  // From a step's lists, already checked against the signature (CheckKernelArguments):")
    out.append("  // the ints and floats by position, every present buffer through resolve(handle).")
    out.append("  template <typename Ints, typename Floats, typename Ins, typename Outs, typename Resolve>")
    out.append("  static " + ident + "Args Decode(const Ints& ints, const Floats& floats, const Ins& ins,")
    out.append("                           const Outs& outs, Resolve&& resolve) {")
    out.append(f"    {ident}Args a;")
    for i, (name, kind) in enumerate(k.ints):
        value = f"ints[{i}] != 0" if kind == "Flag" else f"ints[{i}]"
        out.append(f"    a.{name} = {value};")
    for i, name in enumerate(k.floats):
        out.append(f"    a.{name} = floats[{i}];")
    for role, buffers in (("ins", k.ins), ("outs", k.outs)):
        if not buffers:
            continue
        counter = f"{role[:-1]}_index"
        out.append(f"    [[maybe_unused]] size_t {counter} = 0;")
        for b in buffers:
            take = f"a.{b.name} = resolve({role}[{counter}++]);"
            if b.present_if >= 0:
                out.append(f"    if (a.{k.ints[b.present_if][0]}) {take}")
            else:
                out.append(f"    {take}")
    if not k.floats:
        out.append("    (void)floats;")
    out.append("    return a;")
    out.append("  }")
    out.append("")
    out.append("  // The step's lists in the signature's order (absent buffers left out).")
    out.append("  EncodedStep<Buffer> Encode() const {")
    out.append("    EncodedStep<Buffer> s;")
    # The fields through this->: a field may be named like the local `s` (state_scan's s).
    ints = ", ".join(f"this->{n}" for n, _ in k.ints)
    out.append(f"    s.ints = {{{ints}}};")
    if k.floats:
        out.append(f"    s.floats = {{{', '.join('this->' + n for n in k.floats)}}};")
    for role, buffers in (("ins", k.ins), ("outs", k.outs)):
        for b in buffers:
            push = f"s.{role}.push_back(this->{b.name});"
            if b.present_if >= 0:
                out.append(f"    if (this->{k.ints[b.present_if][0]}) {push}")
            else:
                out.append(f"    {push}")
    out.append("    return s;")
    out.append("  }")
    out.append("};")
    out.append("")


def emit(kernels, source):
    out = [
        f"// Generated by runtime/plan/gen_kernel_table.py from {source}: do not edit.",
        "#pragma once",
        "",
        "#include <cstddef>",
        "#include <cstdint>",
        "#include <string_view>",
        "",
        '#include "runtime/plan/KernelSignature.h"',
        "",
        "namespace hcp::plan {",
        "",
        "enum class KernelId : uint8_t {",
    ]
    out += [f"  {k.ident}," for k in kernels]
    out += ["};", "", f"inline constexpr int kNumKernels = {len(kernels)};", ""]
    out.append("// X(Id, \"name\") for every kernel, in the table's order (a backend's dispatch).")
    out.append("#define HCP_FOR_EACH_KERNEL(X) \\")
    out += [f'  X({k.ident}, "{k.name}") \\' for k in kernels]
    out += ["", "namespace signature_data {", ""]
    for k in kernels:
        emit_signature(k, out)
    out += ["", "}  // namespace signature_data", ""]
    out.append("// Indexed by KernelId.")
    out.append("inline constexpr KernelSignature kKernelSignatures[] = {")
    for k in kernels:
        d = "signature_data::k" + k.ident
        parts = [f'"{k.name}"', "true" if k.collective else "false",
                 "true" if k.beside else "false",
                 span_of(d + "Ints", k.ints), span_of(d + "Floats", k.floats),
                 span_of(d + "Ins", k.ins), span_of(d + "Outs", k.outs),
                 span_of(d + "Rules", k.rules)]
        out.append("    {" + ", ".join(parts) + "},")
    out += ["};", ""]
    for k in kernels:
        emit_struct(k, out)
    out += ["}  // namespace hcp::plan", ""]
    return "\n".join(out)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    source, target = sys.argv[1], sys.argv[2]
    try:
        kernels = parse(source)
    except DescriptionError as e:
        sys.exit(f"gen_kernel_table.py: {e}")
    text = emit(kernels, "runtime/plan/KernelTable.txt")
    with open(target, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
