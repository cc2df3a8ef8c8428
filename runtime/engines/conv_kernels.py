"""The source of the direct convolution kernels (direct_conv.py plans and runs them): the
correlation that is the forward and the input gradient, the input gradient at a stride (one
correlation per column phase, interleaved), and the weight gradient, each generated for its
shapes so that its loops have constant trip counts, for runtime/compile.py to compile once.
"""
from __future__ import annotations

CHANNELS = 4  # output channels per block
VECTORS = 2  # vectors of columns per block of the forward and the input gradient
TAPS = 3  # taps per block of the weight gradient


def correlation_source(N, Ci, Hi, Wi, KH, KW, Co, L, assign, padding=(0, 0), stride=(1, 1)) -> str:
    """`run(inp, k, out)`: out[n, o, y, x] (+)= sum over c, r, s of inp[n, c, SH * y + r, SW * x +
    s] * k[c, r, s, o], inp's rows split by column phase (`_phases_source`), out
    C-ordered, both flat, k in blocks of output channels (`direct_conv._blocks`); in parallel over the rows
    (n, y) of out. With `padding` (rows, columns), `run(src, inp, k, out)`
    first copies src into inp's middle, zeros around it: numpy took 1.2 ms for the 4.5 MB of a
    convolution's input gradient, half of it filling what the copy then overwrites."""
    SH, SW = stride
    Ho, Wo = (Hi - KH) // SH + 1, (Wi - KW) // SW + 1
    row, columns = _phase_layout(Wi, SW, KW)
    MR = min(CHANNELS, Co)
    NR = max(v for v in range(1, VECTORS + 1) if v * L <= Wo)
    block = NR * L
    acc = [[f"a{t}_{u}" for u in range(NR)] for t in range(MR)]
    every = [a for line in acc for a in line]
    body = [f"{a} = simd.zero(out)" for a in every]
    body += [f"for c in range({Ci}):",
             f"    for r in range({KH}):",
             f"        base = n * {Ci * Hi * row} + c * {Hi * row} + ({SH} * y + r) * {row} + xb",
             f"        kb = (b * {Ci} + c) * {KH * KW * MR} + r * {KW * MR}",
             f"        for s in range({KW}):",
             "            at = base + COLUMN[s]"]
    body += [f"            v{u} = simd.load(inp, at + {u * L})" for u in range(NR)]
    for t in range(MR):
        body.append(f"            w = simd.splat(k, kb + {t})")
        body += [f"            {acc[t][u]} = simd.fma(w, v{u}, {acc[t][u]})" for u in range(NR)]
    body.append(f"            kb += {MR}")
    body.append(f"o = n * {Co * Ho * Wo} + ob * {Ho * Wo} + y * {Wo} + xb")
    for t in range(MR):
        stores = []
        for u in range(NR):
            at = f"o + {t * Ho * Wo + u * L}"
            if assign:  # a block that overlaps the one before writes the same values again
                stores.append(f"simd.store(out, {at}, {acc[t][u]})")
            else:
                new = acc[t][u] if Wo % block == 0 else f"simd.keep_from({acc[t][u]}, xbi - xb - {u * L})"
                stores.append(f"simd.store(out, {at}, simd.add(simd.load(out, {at}), {new}))")
        if not assign and Co % MR:
            body.append(f"if ob + {t} >= obi:")
            body += ["    " + line for line in stores]
        else:
            body += stores
    return _module([
        f"COLUMN = {columns!r}",
        "",
        "",
        "@kernel",
        "def rows(lo, hi, inp, k, out):",
        "    for item in range(lo, hi):",
        f"        n = item // {Ho}",
        f"        y = item - n * {Ho}",
        f"        for b in range({-(-Co // MR)}):",
        f"            obi = b * {MR}",
        f"            ob = min(obi, {Co - MR})",
        f"            for xbi in range(0, {Wo}, {block}):",
        f"                xb = min(xbi, {Wo - block})",
        *("                " + line for line in body),
        "",
        "",
        *(_padding_source(N * Ci, Hi, Wi, *padding, N * Ho, L) if any(padding) else
          _phases_source(N * Ci * Hi, Wi, SW, "run(x, inp, k, out)", "x", "inp",
                         f"parallel_for(rows, 0, {N * Ho}, inp, k, out)") if SW > 1 else [
            "def run(inp, k, out):",
            f"    parallel_for(rows, 0, {N * Ho}, inp, k, out)"]),
    ])


def phase_width(Wi: int, SW: int) -> int:
    """The columns of each phase j % SW of a row of Wi columns split by phase (the last ones may
    hold one zero more)."""
    return -(-Wi // SW)


def _phase_layout(Wi: int, SW: int, KW: int) -> tuple[int, tuple[int, ...]]:
    """The length of a row of x split by column phase, and where tap s's columns start in it."""
    Wq = phase_width(Wi, SW)
    return SW * Wq, tuple(s % SW * Wq + s // SW for s in range(KW))


def strided_input_source(N, O, C, Ho, Wo, KH, KW, Hi, Wi, stride, L, assign) -> str:
    """`run(y, padded, k, split, x)`: x[n, c, SH * i + r, SW * j + s] (+)= sum over o of y[n, o, i, j]
    * k[o, r, s, c] (k in blocks of channels, `direct_conv._blocks`, and scaled), all flat. Each column phase p
    of x's rows is a correlation of y's rows, zero-padded in their columns, with the taps s = p +
    SW * m: `rows` writes x's rows split by phase into `split` (no row is written twice), then
    `unsplit` interleaves them into x, adding where x holds a contribution already. A row Y of x
    sums over the rows r with Y - r a multiple of SH in range; a row no tap reaches gets zeros."""
    SH, SW = stride
    Wq = phase_width(Wi, SW)
    row = SW * Wq
    P = (KW - 1) // SW  # zero columns before each padded row of y: the most taps a phase has, less 1
    Wg = Wq + P
    MR = min(CHANNELS, C)
    NR = max(v for v in range(1, VECTORS + 1) if v * L <= Wq)
    block = NR * L
    acc = [[f"a{t}_{u}" for u in range(NR)] for t in range(MR)]
    every = [a for line in acc for a in line]
    body = [f"for b in range({-(-C // MR)}):",
            f"    ob = min(b * {MR}, {C - MR})"]
    for p in range(SW):
        taps = [s for s in range(p, KW, SW)]
        inner = [f"for xbi in range(0, {Wq}, {block}):",
                 f"    xb = min(xbi, {Wq - block})",
                 *(f"    {a} = simd.zero(split)" for a in every)]
        if taps:
            inner += [f"    for o in range({O}):",
                      f"        for r in range({KH}):",
                      "            d = Y - r",
                      f"            if d >= 0 and d % {SH} == 0 and d < {SH * Ho}:",
                      f"                base = ((n * {O} + o) * {Ho} + d // {SH}) * {Wg} + xb + {P}",
                      f"                kb = (b * {O} + o) * {KH * KW * MR} + r * {KW * MR}"]
            for s in taps:
                step = [f"v{u} = simd.load(padded, base + {u * L - s // SW})" for u in range(NR)]
                for t in range(MR):
                    step.append(f"w = simd.splat(k, kb + {s * MR + t})")
                    step += [f"{acc[t][u]} = simd.fma(w, v{u}, {acc[t][u]})" for u in range(NR)]
                inner += ["                " + line for line in step]
        inner.append(f"    at = ((n * {C} + ob) * {Hi} + Y) * {row} + {p * Wq} + xb")
        inner += [f"    simd.store(split, at + {t * Hi * row + u * L}, {acc[t][u]})"
                  for t in range(MR) for u in range(NR)]
        body += ["    " + line for line in inner]
    write = "=" if assign else "+="
    unsplit = [f"for q in range({Wi // SW}):"]
    unsplit += [f"    x[to + {SW} * q + {p}] {write} split[at + {p * Wq} + q]" for p in range(SW)]
    unsplit += [f"x[to + {j}] {write} split[at + {j % SW * Wq + j // SW}]" for j in range(Wi // SW * SW, Wi)]
    return _module([
        "@kernel",
        "def pad(lo, hi, y, padded):",
        "    for line in range(lo, hi):",
        f"        at = line * {Wo}",
        f"        to = line * {Wg}",
        f"        for j in range({P}):",
        "            padded[to + j] = 0",
        f"        for j in range({Wo}):",
        f"            padded[to + {P} + j] = y[at + j]",
        f"        for j in range({P + Wo}, {Wg}):",
        "            padded[to + j] = 0",
        "",
        "",
        "@kernel",
        "def rows(lo, hi, padded, k, split):",
        "    for item in range(lo, hi):",
        f"        n = item // {Hi}",
        f"        Y = item - n * {Hi}",
        *("        " + line for line in body),
        "",
        "",
        "@kernel",
        "def interleave(lo, hi, split, x):",
        "    for line in range(lo, hi):",
        f"        at = line * {row}",
        f"        to = line * {Wi}",
        *("        " + line for line in unsplit),
        "",
        "",
        "def run(y, padded, k, split, x):",
        f"    parallel_for(pad, 0, {N * O * Ho}, y, padded)",
        f"    parallel_for(rows, 0, {N * Hi}, padded, k, split)",
        f"    parallel_for(interleave, 0, {N * C * Hi}, split, x)",
    ])


def _phases_source(lines: int, Wi: int, SW: int, signature: str, rows: str, split: str,
                   then: str) -> list[str]:
    """`phases`: each of x's `lines` rows into `split`'s, its columns grouped by phase j % SW (the
    columns a strided row of taps reads, contiguous; `_phase_layout`), then `run` does `then`.
    numpy's strided copies took 1.3 ms for conv2d stride 2's 4 MB input."""
    Wq = phase_width(Wi, SW)
    row = SW * Wq
    body = [f"for q in range({Wi // SW}):"]
    body += [f"    out[to + {p * Wq} + q] = src[at + {SW} * q + {p}]" for p in range(SW)]
    body += [f"out[to + {j % SW * Wq + j // SW}] = src[at + {j}]" for j in range(Wi // SW * SW, Wi)]
    body += [f"out[to + {p * Wq + Wq - 1}] = 0" for p in range(SW) if len(range(p, Wi, SW)) < Wq]
    return [
        "@kernel",
        "def phases(lo, hi, src, out):",
        "    for line in range(lo, hi):",
        f"        at = line * {Wi}",
        f"        to = line * {row}",
        *("        " + line for line in body),
        "",
        "",
        f"def {signature}:",
        f"    parallel_for(phases, 0, {lines}, {rows}, {split})",
        f"    {then}",
    ]


def _padding_source(planes, Hp, Wp, ph, pw, rows, L) -> list[str]:
    """`pad`: inp's rows from src's, with zeros around, in vectors (a row of at least L elements;
    its last vector overlaps the one before)."""
    H, W = Hp - 2 * ph, Wp - 2 * pw
    copy = [f"for j in range(0, {W - L + 1}, {L}):",
            f"    simd.store(inp, at + {pw} + j, simd.load(src, first + j))"]
    if W % L:
        copy.append(f"simd.store(inp, at + {pw + W - L}, simd.load(src, first + {W - L}))")
    zeros = [f"inp[at + {j}] = 0" for j in range(pw)] + [f"inp[at + {pw + W + j}] = 0" for j in range(pw)]
    return [
        "@kernel",
        "def pad(lo, hi, src, inp):",
        "    for row in range(lo, hi):",
        f"        i = row % {Hp} - {ph}",
        f"        at = row * {Wp}",
        f"        if 0 <= i < {H}:",
        f"            first = (row // {Hp} * {H} + i) * {W}",
        *("            " + line for line in zeros + copy),
        "        else:",
        f"            for j in range({Wp}):",
        "                inp[at + j] = 0",
        "",
        "",
        "def run(src, inp, k, out):",
        f"    parallel_for(pad, 0, {planes * Hp}, src, inp)",
        f"    parallel_for(rows, 0, {rows}, inp, k, out)",
    ]


def weight_gradient_source(N, O, C, Ho, Wo, KH, KW, L, k_strides, scale, assign, Hi, Wi, stride) -> str:
    """`run(y, x, k)`: k[o, c, r, s] (+)= scale * sum over n, i, j of y[n, o, i, j] * x[n, c, SH * i
    + r, SW * j + s], y C-ordered, x's rows split by column phase (`_phases_source`),
    both flat, k flat with the element strides k_strides of o, c, r, s; in parallel over blocks
    of (output channels, c)."""
    SH, SW = stride
    row, columns = _phase_layout(Wi, SW, KW)
    MR = min(CHANNELS, O)
    so, sc, sr, ss = k_strides
    taps = [(r, s) for r in range(KH) for s in range(KW)]
    width = min(TAPS, len(taps))
    groups = -(-len(taps) // width)
    padded = taps + [taps[0]] * (groups * width - len(taps))  # the last block's spare taps: unstored repeats
    acc = [[f"a{t}_{u}" for u in range(width)] for t in range(MR)]
    every = [a for line in acc for a in line]

    def products(indent: str, keep: str | None) -> list[str]:
        def wrap(e):
            return e if keep is None else f"simd.keep_from({e}, {keep})"
        lines = [f"v{u} = {wrap(f'simd.load(x, xb + o{u} + j)')}" for u in range(width)]
        for t in range(MR):
            lines.append(f"g = {wrap(f'simd.load(y, yb + {t * Ho * Wo} + j)')}")
            lines += [f"{acc[t][u]} = simd.fma(g, v{u}, {acc[t][u]})" for u in range(width)]
        return [indent + line for line in lines]

    new_rows = O % MR != 0  # the last block overlaps the one before: only its new channels are written
    clear = []
    if assign:
        zero = [f"for tap in range({len(taps)}):", f"    k[(ob + t) * {so} + c * {sc} + K_AT[tap]] = 0"]
        if new_rows:
            zero = ["if ob + t >= obi:"] + ["    " + line for line in zero]
        clear = [f"for t in range({MR}):"] + ["    " + line for line in zero]
    stores = []
    for t in range(MR):
        for u in range(width):
            cond = [f"REAL[{width} * grp + {u}]"] * (len(padded) > len(taps))
            cond += [f"ob + {t} >= obi"] * new_rows
            store = (f"k[(ob + {t}) * {so} + c * {sc} + K_AT[{width} * grp + {u}]] += "
                     f"{float(scale)!r} * simd.total({acc[t][u]})")
            stores += [f"if {' and '.join(cond)}:", "    " + store] if cond else [store]
    tail = Wo % L
    lines = [
        f"X_AT = {tuple(r * row + columns[s] for r, s in padded)!r}",
        f"K_AT = {tuple(r * sr + s * ss for r, s in padded)!r}",
        f"REAL = {tuple(k < len(taps) for k in range(len(padded)))!r}",
        "",
        "",
        "@kernel",
        "def blocks(lo, hi, y, x, k):",
        "    for item in range(lo, hi):",
        f"        obi = (item // {C}) * {MR}",
        f"        c = item - (item // {C}) * {C}",
        f"        ob = min(obi, {O - MR})",
        *("        " + line for line in clear),
        f"        for n in range({N}):",
        f"            for grp in range({groups}):",
        *(f"                o{u} = X_AT[{width} * grp + {u}]" for u in range(width)),
        *(f"                {a} = simd.zero(y)" for a in every),
        f"                for i in range({Ho}):",
        f"                    yb = n * {O * Ho * Wo} + ob * {Ho * Wo} + i * {Wo}",
        f"                    xb = n * {C * Hi * row} + c * {Hi * row} + i * {SH * row}",
        f"                    for j in range(0, {Wo - L + 1}, {L}):",
        *products("                        ", None),
    ]
    if tail:  # the row's last vector overlaps the one before: zero the lanes it already summed
        lines += [f"                    j = {Wo - L}", *products("                    ", str(L - tail))]
    lines += ["                " + line for line in stores]
    main = f"parallel_for(blocks, 0, {-(-O // MR) * C}, y, x, k)"
    if SW > 1:
        lines += ["", ""] + _phases_source(N * C * Hi, Wi, SW, "run(y, x_rows, x, k)", "x_rows", "x", main)
    else:
        lines += ["", "", "def run(y, x, k):", "    " + main]
    return _module(lines)


def _module(lines: list[str]) -> str:
    return "from halide_ad.runtime.engines import simd\n\n\n" + "\n".join(lines) + "\n"
