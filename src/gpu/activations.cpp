/* src/gpu/activations.cpp - the activation arena and the forward plans. */

// ---------------------------------------------------------------------------------------------------
// 16.3 [activations] [forward plan]
// ---------------------------------------------------------------------------------------------------

/* [SoloQ] Weight rows a DLLM__W_Q4 GEMM dequantises at a time (a multiple of 64, about 16M elements: 32 MB of bf16). */
static int dllm__q4_chunk_rows(int n, int k) { return std::min(n, std::max(64, (16 << 20) / k / 64 * 64)); }

/* [INT8 GEMM] The weight rows of an N x K weight the INT8 path unpacks at a time: as many chunks as the BF16 path's
 * (dllm__q4_chunk_rows) but of equal size, a multiple of 4 and at most the BF16 path's (so act_.q4w and act_.q4acc hold
 * them): down's 4096 rows of K = 12288 go as 4 x 1024 instead of 3 x 1344 + 64, whose last GEMM would be a sliver. N a
 * multiple of 4. */
static int dllm__q4_int8_chunk_rows(int n, int k) {
    const int most = dllm__q4_chunk_rows(n, k), pieces = (n + most - 1) / most;
    return dllm__round_up((n + pieces - 1) / pieces, 4);
}

/* A context's activation buffers. Shapes: M = rows forwarded (sequences x rows), M_pad = 16 ceil(M / 16) (an FP8 GEMM
 * writes whole 16-row tiles), d = n_embd, qkv = (n_head + 2 n_kv) head_dim, q = n_head head_dim, ff = n_ff, L = rows
 * of one LM head chunk (at most dllm__lm_chunk_rows) per sequence, S = canvas rows of one sequence. Grown, never
 * shrunk, to the largest forward seen; a buffer that moves bumps `generation` (captured graphs point into it). */
struct dllm__activations {
    dllm__dbuf h;      // fp32 [M][d]: the residual stream
    dllm__dbuf a;      // bf16 [M][d]: a norm's output, the next GEMM's input
    dllm__dbuf qkv;    // bf16 [M_pad][qkv]: fused projection rows, biased and rotated in place
    dllm__dbuf att;    // bf16 [M][q]: attention output
    dllm__dbuf delta;  // bf16 [M_pad + 16][d]: a branch's output (O projection, then down), added into h
    dllm__dbuf gu;     // bf16 [M_pad][2 ff]: gate|up rows
    dllm__dbuf f;      // bf16 [M][ff]: SwiGLU output
    dllm__dbuf y;      // bf16 [sequences x L][d]: the final norm's output
    // fp32 [sequences x L][d]: [truncation] the last layer's residual when it computes the output rows alone
    dllm__dbuf h_cut;
    dllm__dbuf logits;              // fp32 [sequences][L][vocab]: one LM head chunk
    dllm__dbuf partials;            // conf_partial [L][vocab / dllm__vocab_slice]
    dllm__dbuf x0, conf, deferred;  // per candidate row: token (int), ranking key (double), EOS/EoT deferral (uint8)
    dllm__dbuf cutoff;        // fp32 [S]: the sampler filters' cutoff logit per candidate row (top-k / top-p / min-p)
    dllm__dbuf canvas;        // int [sequences][S] (CFG: conditional, then unconditional)
    dllm__dbuf is_prompt;     // uint8 [S]
    dllm__dbuf state;         // dllm_step_state
    dllm__dbuf committed;     // int [S]: the positions the last step committed
    dllm__dbuf positions;     // int [S]: [DPad] the RoPE position of each canvas row
    dllm__dbuf h0;            // fp32 [M][d]: [EmbedCache] layer 0's embeddings
    dllm__dbuf qkv0;          // bf16 [M][qkv]: [RoPECache] layer 0's rotated Q/K/V
    dllm__dbuf fa_state;      // [FACache] layer 0's online-softmax state per query tile outside the block
    dllm__dbuf attn_partial;  // split-KV attention states (K/V-cache steps)
    std::vector<dllm__dbuf> kv;   // [dual cache] [prefix cache] per layer the fused rotated Q/K/V rows [sequences][S]
    dllm__dbuf act8, act8_scale;  // [FP8] one GEMM input, E4M3 [M_pad][k_pad], and its scales [k_pad / 128][M_pad]
    dllm__dbuf act8_chunk_scale;  // [FP8] [batch] one launch's scales [k_pad / 128][rows] (gemm_fp8_batch)
    dllm__dbuf q4a, q4a_scale;    // [SoloQ] one GEMM input: bf16 C values [M][k], fp32 token scales [M]
    dllm__dbuf q4w, q4acc;        // [SoloQ] a chunk of dequantised weight rows (bf16), its fp32 GEMM output [M][chunk]
    dllm__dbuf
        q4a8;  // [INT8 GEMM] one GEMM input as int8 C values [M][k] (q4w then holds int8 weight rows, q4acc int32)
    dllm__dbuf q4wg_ws;  // [W4 GEMM] q4wg's split-K sums (NVFP4: chunk partials) and tile counts: zero (NVFP4: counts)
    dllm__dbuf splitk_ws;  // [row-independent GEMM] gemm_splitk's tile counts (zero) and partials
    int generation = 0;
    /* Every buffer's address, to tell whether growing moved one. */
    std::vector<const void *> addresses() const {
        std::vector<const void *> p = {h.ptr,         a.ptr,          qkv.ptr,       att.ptr,
                                       delta.ptr,     gu.ptr,         f.ptr,         y.ptr,
                                       h_cut.ptr,     logits.ptr,     partials.ptr,  x0.ptr,
                                       conf.ptr,      deferred.ptr,   cutoff.ptr,    canvas.ptr,
                                       is_prompt.ptr, state.ptr,      committed.ptr, positions.ptr,
                                       h0.ptr,        qkv0.ptr,       fa_state.ptr,  attn_partial.ptr,
                                       act8.ptr,      act8_scale.ptr, q4a.ptr,       q4a_scale.ptr,
                                       q4w.ptr,       q4acc.ptr,      q4a8.ptr,      act8_chunk_scale.ptr,
                                       q4wg_ws.ptr,   splitk_ws.ptr};
        for (const dllm__dbuf &b : kv) p.push_back(b.ptr);
        return p;
    }
};

static const int dllm__lm_chunk_rows = 256;  // LM head rows per GEMM: bounds the logits buffer
static const int dllm__vocab_slice = 8192;   // vocabulary entries per sampler CTA

/* How layer 0 runs: plainly, or with LaCache's caches filled (a block's first step) or reused (its later steps). */
enum dllm__layer0 { DLLM__L0_PLAIN, DLLM__L0_FILL, DLLM__L0_REUSE };

/* [forward plan] Which rows one forward computes, per sequence. Rows are canvas positions; output rows are raw logit
 * rows (a model with shifted logits predicts position p from row p - 1). Computed once per step (plan_step) or
 * forward (prepare_forward), passed by reference to every stage. */
struct dllm__seq_rows {
    int seq = 0;                 // canvas rows (the keys every query attends to)
    int q0 = 0, q1 = 0;          // rows forwarded: every row, or under a K/V cache after a block's first step the block
                                 // (dual) or the block and what follows (prefix)
    int head0 = 0, head1 = 0;    // [truncation] canvas positions whose predictions the LM head computes
    int out0 = 0, out1 = 0;      // the raw rows that predict them: they reach the final norm and the LM head
    int block0 = 0, block1 = 0;  // the current block: LaCache's reuse, and the attention's tile order
    int rows() const { return q1 - q0; }
    int out_rows() const { return out1 - out0; }
};
struct dllm__forward_plan {
    std::vector<dllm__seq_rows> seqs;      // CFG's unconditional canvas is a second sequence
    dllm__layer0 layer0 = DLLM__L0_PLAIN;  // LaCache's layer-0 mode
    int batch() const { return (int)seqs.size(); }
    /* Until batching lands every sequence of a forward has the same rows (CFG's two canvases): the stages take them
     * from the first and run all sequences at once. */
    const dllm__seq_rows &rows() const { return seqs[0]; }
    bool uniform() const {
        for (const dllm__seq_rows &r : seqs)
            if (r.seq != seqs[0].seq || r.q0 != seqs[0].q0 || r.q1 != seqs[0].q1 || r.head0 != seqs[0].head0 ||
                r.head1 != seqs[0].head1 || r.out0 != seqs[0].out0 || r.out1 != seqs[0].out1 ||
                r.block0 != seqs[0].block0 || r.block1 != seqs[0].block1)
                return false;
        return !seqs.empty();
    }
};

/* [forward plan] [batch] A batched forward (dllm__gpu_backend::forward_batch) over the canvases of a plan: their rows
 * concatenated, sequence i's rows [offsets[i], offsets[i + 1]) (offsets[B] = rows), each row at its own RoPE position
 * (its canvas index, or DPad's position), no padding. Without a K/V cache a sequence's queries are its keys, so one
 * offsets array serves both sides of the varlen attention. raw0/raw1: the unshifted logit rows sequence i wants
 * (its plan rows [r0, r1) with the model's shift applied backwards), canvas indices. */
struct dllm__varlen_layout {
    std::vector<int32_t> ids, positions, offsets;
    std::vector<int> raw0, raw1;
    std::vector<int> out0;  // where sequence i's logit rows start among all sequences' (gathered for one LM head)
    int rows = 0;           // all sequences' rows
    int max_rows = 0;       // the longest sequence's: the attention's tiles (dllm__attn_varlen_short)
    int out_rows = 0;       // all sequences' logit rows
    std::vector<int> q0;    // sequence i's first forwarded canvas row (0 without a K/V cache)
    // [dual cache] [prefix cache] dllm__kv_layout_of only: the varlen attention's offsets over 2B - 1 entries
    // (2B values: sequence i is entry 2i, its queries rows [offsets[i], offsets[i + 1]) of the forwarded rows, its keys
    // the n rows of its cache slot; entry 2i + 1 has no query row and only bridges to the next slot, which need not
    // follow), and the cache row each forwarded row's K/V goes to. Cache rows count from the start of one layer's
    // cache.
    std::vector<int32_t> attn_q_offsets, attn_kv_offsets, cache_rows;
    // [block diffusion] dllm__bd_batch_layout_of only: per attention entry its (mask_block, q_index0) (attn_args'
    // varlen_masks); empty: no mask
    std::vector<int32_t> attn_masks;
    // Whether sequence i's rows are a step, whose GEMMs are DLLM__ROWS_STEP's (gemm_splitk): under a K/V cache
    // (dllm__kv_layout_of) fewer rows than its canvas, in block diffusion (dllm__bd_batch_layout_of) a forward of at
    // most 128 rows; empty: none is
    std::vector<char> step;
    bool cached() const { return !cache_rows.empty(); }
};

/* Appends the RoPE positions of plan sequence i's rows [r0, r1) (s.positions where given, DPad's; else the row index),
 * each checked to lie inside the tables (max_tokens rows), once its s.n rows are known to keep the layout's row count
 * within int32 (the kernels' offsets). Shared by the plain and the K/V-cache layouts. */
static dllm_status dllm__layout_positions(const dllm__batch_seq &s, size_t i, int r0, int r1, int max_tokens,
                                          dllm__varlen_layout &v) {
    if (v.rows > INT32_MAX - s.n) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "batched forward: more than 2^31 rows");
    for (int r = r0; r < r1; r++) {
        const int32_t pos = s.positions ? s.positions[r] : r;
        if (pos < 0 || pos >= max_tokens)
            return dllm__fail(DLLM_ERR_INTERNAL,
                              "batched forward: sequence %zu row %d at position %d, outside the RoPE tables (%d)", i, r,
                              pos, max_tokens);
        v.positions.push_back(pos);
    }
    return DLLM_OK;
}

/* The layout of a plan, checked: every canvas non-empty and within the RoPE tables (max_tokens rows), its logit rows a
 * non-empty range inside it, its positions (DPad) inside the tables. */
static dllm_status dllm__varlen_layout_of(const dllm__config &c, const std::vector<dllm__batch_seq> &plan,
                                          int max_tokens, dllm__varlen_layout &v) {
    v = dllm__varlen_layout();
    v.offsets.push_back(0);
    for (size_t i = 0; i < plan.size(); i++) {
        const dllm__batch_seq &s = plan[i];
        if (!s.ids || s.n < 1 || s.n > max_tokens || s.r0 < 0 || s.r1 <= s.r0 || s.r1 > s.n)
            return dllm__fail(DLLM_ERR_INTERNAL,
                              "batched forward: sequence %zu has %d rows (at most %d) and logit rows [%d, %d)", i, s.n,
                              max_tokens, s.r0, s.r1);
        DLLM__TRY(dllm__layout_positions(s, i, 0, s.n, max_tokens, v));
        v.ids.insert(v.ids.end(), s.ids, s.ids + s.n);
        v.rows += s.n;
        v.offsets.push_back(v.rows);
        v.raw0.push_back(dllm__logit_row(c, s.r0));
        v.raw1.push_back(dllm__logit_row(c, s.r1 - 1) + 1);
        v.out0.push_back(v.out_rows);
        v.out_rows += v.raw1.back() - v.raw0.back();
        v.max_rows = std::max(v.max_rows, s.n);
        v.q0.push_back(0);
    }
    return DLLM_OK;
}

/* [batch] [dual cache] [prefix cache] The layout of a batched K/V-cache step (forward_batch_kv): each sequence's
 * forwarded rows [q0, q1) concatenated (ids, positions), their K/V bound for rows [q0, q1) of its slot (slot s's rows
 * start at slot_base[s] and hold at most slot_rows[s]), its queries over the slot's first n rows. Checked: a sequence's
 * logit rows (shift applied) among its forwarded ones, its rows within its slot and the RoPE tables, a filling step
 * forwarding every row, no slot twice. */
static dllm_status dllm__kv_layout_of(const dllm__config &c, const std::vector<dllm__batch_seq> &plan,
                                      const std::vector<int> &slot_base, const std::vector<int> &slot_rows,
                                      int max_tokens, dllm__varlen_layout &v) {
    v = dllm__varlen_layout();
    v.offsets.push_back(0);
    std::vector<bool> used(slot_base.size(), false);
    for (size_t i = 0; i < plan.size(); i++) {
        const dllm__batch_seq &s = plan[i];
        const bool slot_ok = s.slot >= 0 && (size_t)s.slot < slot_base.size() && !used[(size_t)s.slot];
        if (!s.ids || !slot_ok || s.n < 1 || s.n > std::min(max_tokens, slot_rows[(size_t)s.slot]) || s.q0 < 0 ||
            s.q1 <= s.q0 || s.q1 > s.n || (s.fill && (s.q0 != 0 || s.q1 != s.n)) || s.r0 < 0 || s.r1 <= s.r0 ||
            s.r1 > s.n)
            return dllm__fail(
                DLLM_ERR_INTERNAL,
                "batched K/V-cache step: sequence %zu (slot %d, %d rows, forwarded [%d, %d), logit rows [%d, %d)) does "
                "not fit",
                i, s.slot, s.n, s.q0, s.q1, s.r0, s.r1);
        used[(size_t)s.slot] = true;
        const int raw0 = dllm__logit_row(c, s.r0), raw1 = dllm__logit_row(c, s.r1 - 1) + 1;
        if (raw0 < s.q0 || raw1 > s.q1)
            return dllm__fail(
                DLLM_ERR_INTERNAL,
                "batched K/V-cache step: sequence %zu wants logit rows [%d, %d) outside its forwarded rows [%d, %d)", i,
                raw0, raw1, s.q0, s.q1);
        DLLM__TRY(dllm__layout_positions(s, i, s.q0, s.q1, max_tokens, v));
        for (int r = s.q0; r < s.q1; r++) v.cache_rows.push_back(slot_base[(size_t)s.slot] + r);
        v.ids.insert(v.ids.end(), s.ids + s.q0, s.ids + s.q1);
        // entry 2i starts here; entry 2i - 1 (from the previous sequence's end to here) is the bridge, with no query
        // row
        v.attn_q_offsets.push_back(v.rows), v.attn_kv_offsets.push_back(slot_base[(size_t)s.slot]);
        v.rows += s.q1 - s.q0;
        v.attn_q_offsets.push_back(v.rows), v.attn_kv_offsets.push_back(slot_base[(size_t)s.slot] + s.n);
        v.offsets.push_back(v.rows);
        v.raw0.push_back(raw0), v.raw1.push_back(raw1);
        v.out0.push_back(v.out_rows);
        v.out_rows += raw1 - raw0;
        v.max_rows = std::max(v.max_rows, s.q1 - s.q0);
        v.q0.push_back(s.q0);
        v.step.push_back(s.q1 - s.q0 < s.n);
    }
    return DLLM_OK;
}

/* [batch] One sampler launch of a batched step's device choice (forward_batch_choose): canvas positions
 * [pos0, pos0 + n) of plan sequence seq, whose logits are in the LM-head chunk at hand; sampler row r reads the chunk's
 * logits row (shift0 ? max(r - 1, 0) : r) + lrow0 (sampler_args' logits_row) and its choice goes to choices[out +
 * r]. */
struct dllm__sampler_span {
    int seq = 0, pos0 = 0, n = 0, lrow0 = 0, shift0 = 0, out = 0;
};

/* The sampler launches of the LM-head chunk of gathered logit rows [c0, c0 + rows) of layout v: for each sequence i of
 * the plan with choice0[i] >= 0 (its choices start there; -1: its logits go to the host), the positions of its rows
 * [r0, r1) whose logits row (dllm__logit_row, gathered: v.out0[i] + row - v.raw0[i]) is in the chunk. A position reads
 * one row and the rows rise with the position, so each sequence's are one range; under the shift positions 0 and 1
 * both read row 0 (shift0, as the solo step's sample_rows). */
static std::vector<dllm__sampler_span> dllm__batch_sampler_spans(const dllm__config &c,
                                                                 const std::vector<dllm__batch_seq> &plan,
                                                                 const dllm__varlen_layout &v,
                                                                 const std::vector<int> &choice0, int c0, int rows) {
    std::vector<dllm__sampler_span> spans;
    for (size_t i = 0; i < plan.size(); i++) {
        if (choice0[i] < 0) continue;
        auto gathered = [&](int p) { return v.out0[i] + dllm__logit_row(c, p) - v.raw0[i]; };
        int p0 = plan[i].r0, p1 = plan[i].r1;
        while (p0 < p1 && gathered(p0) < c0) p0++;
        while (p1 > p0 && gathered(p1 - 1) >= c0 + rows) p1--;
        if (p0 == p1) continue;
        dllm__sampler_span s;
        s.seq = (int)i, s.pos0 = p0, s.n = p1 - p0, s.lrow0 = gathered(p0) - c0;
        s.shift0 = c.shift_logits && p0 == 0, s.out = choice0[i] + p0 - plan[i].r0;
        spans.push_back(s);
    }
    return spans;
}

/* [batch] [block diffusion] A slot of bd_forward_batch between forwards: its committed rows [0, n) and, after a
 * BLOCK_FULL, the block cache's rows [n, n + block) (0: none). */
struct dllm__bd_slot {
    int n = 0, block = 0;
};
