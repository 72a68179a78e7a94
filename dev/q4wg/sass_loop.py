#!/usr/bin/env python3
"""Main-loop SASS count of the q4wg_gemm kernels in a cuobjdump -sass listing (stdin or file).

Per kernel: the loop = the backward branch whose range holds the most GMMA instructions; inside it, any region
skipped by a forward branch that holds RED / ATOM / STG (the segment flush, taken once per tile segment) is cold.
Hot instructions are everything else in the loop, predicated-off fillers included (they issue).
Weights consumed per pass = GMMA count x 64 x 32 (m64 x k32 per warpgroup instruction, 8-bit A).
Thread-instructions per weight = hot count x 128 threads / weights (the same for every warpgroup of the CTA).
"""
import re, sys, collections

def parse(text):
    funcs, cur = {}, None
    for line in text.splitlines():
        m = re.match(r'\s*Function : (\S+)', line)
        if m:
            cur = m.group(1); funcs[cur] = []; continue
        m = re.match(r'\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;?\s*(/\*.*)?$', line)
        if m and cur:
            ins = m.group(2).rstrip(' ;')
            funcs[cur].append((int(m.group(1), 16), ins))
    return funcs

def opcode(ins):
    t = ins.split()
    if t and t[0].startswith('@'): t = t[1:]
    return t[0] if t else ''

def analyze(name, code):
    addr = [a for a, _ in code]
    idx = {a: i for i, (a, _) in enumerate(code)}
    best = None
    for i, (a, ins) in enumerate(code):
        m = re.search(r'\bBRA\b(?:\s+!?U?P\d,)?\s+(?:`?\(?\.?L?_?x?_?)?0x([0-9a-f]+)', ins)
        if not m: continue
        t = int(m.group(1), 16)
        if t < a and t in idx:
            ng = sum('GMMA' in opcode(x) for _, x in code[idx[t]:i + 1])
            if ng and (best is None or ng > best[2]): best = (idx[t], i, ng)
    if not best: return None
    lo, hi, _ = best
    cold = set()
    for i in range(lo, hi + 1):
        a, ins = code[i]
        m = re.search(r'\bBRA\b(?:\s+!?U?P\d,)?\s+0x([0-9a-f]+)', ins)
        if not m: continue
        t = int(m.group(1), 16)
        if a < t and t in idx and idx[t] <= hi + 1:
            region = range(i + 1, idx[t])
            ops = [opcode(code[j][1]) for j in region]
            if any(o.startswith(('RED', 'ATOM', 'STG')) for o in ops): cold.update(region)
    hot = [code[i][1] for i in range(lo, hi + 1) if i not in cold]
    mix = collections.Counter(opcode(x).split('.')[0] for x in hot)
    ngmma = sum('GMMA' in opcode(x) for x in hot)
    # IGMMA m64k32 (8-bit A): 2048 weights; HGMMA m64k16 (bf16 A, the NVFP4 path): 1024
    weights = sum((1024 if opcode(x).startswith('HGMMA') else 2048) for x in hot if 'GMMA' in opcode(x))
    return dict(name=name, hot=len(hot), cold=len(cold), gmma=ngmma, weights=weights,
                per_weight=len(hot) * 128.0 / weights, mix=mix, span=(code[lo][0], code[hi][0]))

def main():
    text = open(sys.argv[1]).read() if len(sys.argv) > 1 else sys.stdin.read()
    funcs = parse(text)
    worst = 0
    for name, code in funcs.items():
        if 'q4wg_gemm' not in name: continue
        r = analyze(name, code)
        if not r: print(f'{name}: no loop found'); continue
        worst = max(worst, r['per_weight'])
        m = re.search(r'q4wg_gemmILi(\d+)ELi(\d+)ELi(\d+)ELi(\d+)ELi(\d+)ELi(\d+)ELi(n?\d+)ELi(\d+)E', name)
        mn = re.search(r'q4wg_gemm_nvILi(\d+)ELi(\d+)ELi(\d+)ELi(\d+)ELi(\d+)ELi(\d+)E', name)
        if m:
            tag = 'INT NT=%s FMT=%s WGS=%s R=%s P=%s SG=%s WAITK=%s CL=%s' % tuple(g.replace('n', '-') for g in m.groups())
        elif mn:
            tag = 'NVFP4 NT=%s WGS=%s R=%s P=%s SG=%s WAITH=%s' % mn.groups()
        else:
            tag = name
        print(f"{tag}: main loop 0x{r['span'][0]:x}-0x{r['span'][1]:x}: {r['hot']} hot SASS instructions "
              f"({r['cold']} in the flush, not counted), {r['gmma']} GMMA = {r['weights']} weights a warpgroup "
              f"-> {r['per_weight']:.3f} thread-instructions per weight")
        keys = ['LDG', 'LOP3', 'IMAD', 'SHF', 'HMUL2', 'IGMMA', 'HGMMA', 'WARPGROUP', 'LDGSTS', 'LDGDEPBAR', 'DEPBAR', 'BAR', 'MEMBAR',
                'FENCE', 'LDS', 'IADD3', 'ISETP', 'MOV', 'UIADD3', 'BRA']
        mix = r['mix']
        parts = [f'{k} {mix[k]}' for k in keys if mix.get(k)]
        rest = sum(v for k, v in mix.items() if k not in keys)
        print('    mix: ' + ', '.join(parts) + f', other {rest}')
        print('    other: ' + ', '.join(f'{k} {v}' for k, v in sorted(mix.items(), key=lambda kv: -kv[1]) if k not in keys))
    print(f'worst: {worst:.3f} thread-instructions per weight (target <= 1.5)')

main()
