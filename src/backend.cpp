/* src/backend.cpp - the backend interface both backends implement, and the shared step logic. */

// ---------------------------------------------------------------------------------------------------
// 11. Backends (CPU reference)
//     A backend runs forwards and denoising steps; the SAR schedule above it is shared. The GPU backend
//     implements the same two calls with device kernels.
// ---------------------------------------------------------------------------------------------------

/* The state of one generation, shared by the schedule and the backend. */
struct dllm__decode {
    std::vector<int32_t> canvas;     // prompt ++ generation (on the GPU: current after finish() or a host step)
    std::vector<uint8_t> is_prompt;  // the reference's prompt_index (prompt positions that are not MASK)
    int n_prompt = 0;
    int block_begin = 0, block_end = 0;  // current block; candidates are masked positions before block_end
    int steps_per_block = 0;
    int step_in_block = 0;  // advanced by the schedule after each step
    int global_step = 0;    // counts steps across blocks; keys the RNG
    int n_block_masks = 0;  // masks in the block at its first step (CPU backend)
    int n_block_left = 0;   // masks left in the block after a step (set by threshold/factor steps)
    int cand_lo = 0;        // no candidate before this position (GPU backend)
    int lacache = 0;        // dllm_lacache (GPU backend; the CPU computes the same function)
    dllm__unmask_rule unmask;
    dllm_kv_cache kv_cache = DLLM_KV_CACHE_NONE;
    std::vector<int32_t> positions;  // RoPE position of each canvas row (DPad's compacted canvas); empty: the index
    int32_t mask_id = 0;
    float cfg_scale = 0;
    dllm__sampling sampling;
    int forwards = 0;
    void *debug_tag = nullptr;  // the generation's on_step_data: names the sequence to dllm__debug_step_logits
    bool host_steps =
        false;  // stepped on the host around forward_batch (dllm_generate_batch): no device state of its own
};

/* One canvas of a batched forward (dllm__backend_impl::forward_batch) and the logit rows it wants. */
struct dllm__batch_seq {
    const int32_t *ids = nullptr;
    int n = 0;
    const int32_t *positions = nullptr;  // RoPE position of each row; null: the row index
    int r0 = 0, r1 = 0;                  // logit rows [r0, r1), shift applied
    // [batch] [dual cache] [prefix cache] forward_batch_kv only: the rows forwarded [q0, q1) (dllm__step_rows), their
    // K/V written into cache `slot` (batch_kv_reserve), their queries over its n rows; fill: the block's first step,
    // every row forwarded, the cache (re)started with n rows
    int q0 = 0, q1 = 0, slot = -1;
    bool fill = false;
    // forward_batch_choose only: non-null, the backend chooses the tokens of rows [r0, r1) as dllm__choose does with
    // these parameters at canvas position r and step `step` (dllm__decode::global_step), and returns no logits for them
    const dllm__sampling *sampling = nullptr;
    int step = 0;
};

/* The rows of a block-diffusion step whose tokens are chosen: row i (0 <= i < n) is canvas position pos0 + i, scored
 * by raw logits row (shift0 ? max(i - 1, 0) : i) + lrow0 of the forward's [r0, r1) (the sampler's logits_row). */
struct dllm__bd_pick {
    dllm__sampling sampling;
    int pos0 = 0, n = 0, shift0 = 0, lrow0 = 0;
    int logits_row(int i) const { return (shift0 ? std::max(i - 1, 0) : i) + lrow0; }
};

/* One sequence of a batched block-diffusion forward (dllm__backend_impl::bd_forward_batch). */
struct dllm__bd_seq {
    int slot = -1;       // its committed K/V cache: an index into bd_batch_reserve's list
    dllm__bd_call call;  // what bd_forward takes, against that slot's cache (its own committed length)
    const dllm__bd_pick *pick =
        nullptr;  // non-null: the backend returns this sequence's choices (pick->n of them), no logits
};

/* [batch] What a backend batches (dllm_stepper asks before it plans): each reason empty where the backend has that
 * batched forward, else why not, the message a sequence that then decodes alone reports. */
struct dllm__batch_caps {
    std::string plain, kv, block_diffusion;  // forward_batch, forward_batch_kv, bd_forward_batch
};

/* What a backend does; the SAR schedule (section 17) drives it. */
struct dllm__backend_impl {
    virtual ~dllm__backend_impl() {}
    /* Logits for positions [r0, r1) of one forward over ids[0..n) (shift already applied). */
    virtual dllm_status logits(const int32_t *ids, int n, int r0, int r1, float *out) = 0;
    /* A generation starts: st.canvas holds prompt ++ masks. */
    virtual dllm_status begin(dllm__decode &) { return DLLM_OK; }
    /* A block starts: st.block_begin/block_end/steps_per_block are set. */
    virtual dllm_status begin_block(dllm__decode &st) = 0;
    /* One denoising step: x0 and confidence at every candidate, commit what the unmasking rule lets through
     * (dllm__select). With want_host, st.canvas and committed (ascending positions) are current on return. */
    virtual dllm_status step(dllm__decode &st, std::vector<int32_t> &committed, bool want_host) = 0;
    /* The generation ends: st.canvas must be current. */
    virtual dllm_status finish(dllm__decode &) { return DLLM_OK; }
    /* Block diffusion (section 17): a generation starts with an empty committed K/V cache of `rows` rows. */
    virtual dllm_status bd_begin(int rows) = 0;
    /* The most committed rows bd_begin could hold now (key groups of `group` rows under kv_quant), for the capacity
     * check before a generation: the host's memory is not checked (no limit). */
    virtual dllm_status bd_rows_that_fit(int group, int64_t &rows) const {
        (void)group;
        rows = INT64_MAX;
        return DLLM_OK;
    }
    /* One forward of the block-diffusion schedule (dllm__bd_call); raw logits of rows [call.r0, call.r1). */
    virtual dllm_status bd_forward(const dllm__bd_call &call, float *logits) = 0;
    /* Whether the backend chooses a step's tokens where its logits are
     * (bd_forward_choose: every row of the pick, out[n]); otherwise section 17 runs dllm__choose on the host over
     * bd_forward's logits, which is the twin. */
    virtual bool bd_chooses() const { return false; }
    virtual dllm_status bd_forward_choose(const dllm__bd_call &, const dllm__bd_pick &, dllm__choice *) {
        return dllm__fail(DLLM_ERR_INTERNAL, "this backend chooses block-diffusion tokens on the host");
    }
    /* [FACache] since bd_begin: layer-0 block rows a forward needed the committed state of, and rows that reused it. */
    virtual void bd_facache_rows(int64_t &rows, int64_t &reused) const { rows = reused = 0; }
    /* [batch] [block diffusion] Committed K/V caches for a batch of block-diffusion sequences: slot s sized for rows[s]
     * rows, empty (what bd_begin(rows[s]) does for a generation alone) unless keep[s]: then it keeps its rows and state
     * (a live sequence's; its size unchanged), wherever the new layout puts it. The empty list releases them.
     * Unsupported (the reason in the message): dllm_generate_batch decodes block-diffusion items one after another
     * through bd_forward. */
    virtual dllm_status bd_batch_reserve(const std::vector<int> &rows, const std::vector<bool> &keep) {
        (void)rows, (void)keep;
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "this backend has no batched block-diffusion forward");
    }
    dllm_status bd_batch_reserve(const std::vector<int> &rows) { return bd_batch_reserve(rows, {}); }  // all empty
    /* One forward over several block-diffusion sequences, each against its own slot (a slot appears at most once), each
     * sequence's result bit-identical whatever else is in the batch (a batch of one included; on the CPU also identical
     * to bd_forward alone). Sequences without a pick: their raw logit rows [call.r0, call.r1), one sequence after
     * another in `logits`. Sequences with a pick: pick->n choices each
     * (dllm__choose at pick->pos0 + i, step 0, over raw row pick->logits_row(i) of [r0, r1): what
     * dllm__bd_generation::forward_choose computes), one sequence after another in `choices`. A COMMIT advances its
     * slot's committed length, as bd_forward does. */
    virtual dllm_status bd_forward_batch(const std::vector<dllm__bd_seq> &, float *, dllm__choice *) {
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "this backend has no batched block-diffusion forward");
    }
    /* Which of the three batched forwards below this backend has (the default: none, and sequences decode one after
     * another through step() and bd_forward). */
    virtual dllm__batch_caps batch_caps() const {
        return {"this backend has no batched forward", "this backend has no batched K/V-cache step",
                "this backend has no batched block-diffusion forward"};
    }
    /* One forward over several canvases (dllm_generate_batch): each sequence's logit rows [r0, r1) (shift applied),
     * one sequence after another in out, each bit-identical to its forward alone. */
    virtual dllm_status forward_batch(const std::vector<dllm__batch_seq> &plan, float *out) {
        (void)plan, (void)out;
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "this backend has no batched forward");
    }
    /* [batch] [dual cache] [prefix cache] The K/V caches of a batched decode: slot i holds up to rows[i] canvas rows,
     * for every layer; with keep[i] it keeps its rows (a live sequence's; its size unchanged), wherever the new layout
     * puts it. Replaces the previous layout; an empty list releases them. */
    virtual dllm_status batch_kv_reserve(const std::vector<int> &rows, const std::vector<bool> &keep) {
        (void)rows, (void)keep;
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "this backend has no batched K/V-cache step");
    }
    dllm_status batch_kv_reserve(const std::vector<int> &rows) { return batch_kv_reserve(rows, {}); }  // none kept
    /* forward_batch over sequences that each have a K/V cache (dllm__batch_seq's q0, q1, slot, fill): their rows in one
     * forward, each sequence's logits bit-identical to its own in a batch of one. */
    virtual dllm_status forward_batch_kv(const std::vector<dllm__batch_seq> &plan, float *out) {
        (void)plan, (void)out;
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "this backend has no batched K/V-cache step");
    }
    /* [batch] Whether a sequence's forwards alone (step, bd_forward) give it the bits its batched forwards give it:
     * where they do not, dllm_generate decodes a prompt as a batch of one (dllm__generate_one). */
    virtual bool solo_equals_batch() const { return true; }
    /* [batch] Whether the backend chooses a batched step's tokens where its logits are (forward_batch_choose);
     * otherwise dllm__batch_step runs dllm__choose on the host over forward_batch's logits, which is the twin. */
    virtual bool batch_chooses() const { return false; }
    /* forward_batch (kv false) or forward_batch_kv (kv true) of a plan in which the sequences with a sampling
     * (dllm__batch_seq) have their tokens chosen by the backend: rows [r0, r1) of each, one sequence after another, in
     * choices; the other sequences' logits one after another in logits, as forward_batch returns them. */
    virtual dllm_status forward_batch_choose(const std::vector<dllm__batch_seq> &plan, bool kv, float *logits,
                                             dllm__choice *choices) {
        (void)plan, (void)kv, (void)logits, (void)choices;
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "this backend chooses batched tokens on the host");
    }
};

/* [batch] A new slot layout's kept slots (keep[s]: a live sequence's) are slots of the old layout `had` of the same
 * size: a live cache is moved, never resized. */
static dllm_status dllm__check_kept_slots(const std::vector<int> &rows, const std::vector<bool> &keep,
                                          const std::vector<int> &had) {
    for (size_t s = 0; s < keep.size(); s++)
        if (keep[s] && (s >= rows.size() || s >= had.size() || rows[s] != had[s]))
            return dllm__fail(DLLM_ERR_INTERNAL, "batch slot %zu is kept with %d rows, %s", s,
                              s < rows.size() ? rows[s] : -1,
                              s < had.size() ? dllm__format("had %d", had[s]).c_str() : "a slot that did not exist");
    return DLLM_OK;
}

static int dllm__count_masks(const dllm__decode &st, int begin, int end) {
    int n = 0;
    for (int p = begin; p < end; p++) n += st.canvas[(size_t)p] == st.mask_id;
    return n;
}

/* k_i of the LLaDA schedule: n masks over s steps, the remainder to the earliest steps. */
static int dllm__transfer_count(int n_masked, int steps, int i) {
    return n_masked / steps + (i < n_masked % steps ? 1 : 0);
}

/* The count of a counted step: LLaDA's over the block's masks at its start, Dream's over the n_cand candidates
 * left (the block's masks and any [MASK] of the prompt, as Dream counts every mask of its canvas, so that the
 * block's last step commits them all). */
static int dllm__step_count(const dllm__decode &st, int n_cand) {
    if (st.unmask.kind == DLLM_UNMASK_SCHEDULE)
        return dllm__transfer_count(st.n_block_masks, st.steps_per_block, st.step_in_block);
    if (st.unmask.kind == DLLM_UNMASK_TIMESTEPS)
        return dllm__timestep_count(n_cand, st.steps_per_block, st.step_in_block, st.unmask.eps);
    return 0;
}

/* The canvas rows a step forwards: every row, or with a K/V cache after the block's first step the block
 * (dual) or the block and everything after it (prefix). A model with shifted logits also needs the row
 * before the block: it predicts the block's first position. */
static void dllm__step_rows(const dllm__decode &st, int shift, int &q0, int &q1) {
    const int n = (int)st.canvas.size();
    q0 = 0, q1 = n;
    if (st.kv_cache == DLLM_KV_CACHE_NONE || st.step_in_block == 0) return;
    q0 = std::max(0, st.block_begin - shift);
    q1 = st.kv_cache == DLLM_KV_CACHE_DUAL ? st.block_end : n;
}

/* The first non-finite element of a BF16/F16/F32 tensor in [begin, end), or -1: the exponent bits all set. */
static int64_t dllm__first_nonfinite(const dllm__tensor &t, int64_t begin, int64_t end) {
    const size_t size = t.dtype == DLLM__F32 ? 4 : 2;
    const uint32_t exponent = t.dtype == DLLM__F32 ? 0x7F800000u : t.dtype == DLLM__BF16 ? 0x7F80u : 0x7C00u;
    for (int64_t i = begin; i < end; i++) {
        uint32_t bits = 0;
        memcpy(&bits, t.data + size * (size_t)i, size);  // little-endian host: the low bytes
        if ((bits & exponent) == exponent) return i;
    }
    return -1;
}

/* A NaN or infinity in a checkpoint's weights would silently turn every logit into NaN: the CPU backend
 * refuses such a model, naming the first bad element. One pass over the weights, in chunks across threads. */
static dllm_status dllm__check_finite_weights(const dllm_model &m, int n_threads) {
    struct chunk {
        const dllm__tensor *t;
        int64_t begin, end;
    };
    const int64_t chunk_elems = (int64_t)1 << 22;
    std::vector<chunk> chunks;
    for (const dllm__wspec &spec : dllm__expected_weights(m.cfg)) {
        auto it = m.by_name.find(spec.name);
        if (it == m.by_name.end()) continue;
        for (int64_t b = 0; b < it->second->numel; b += chunk_elems)
            chunks.push_back({it->second, b, std::min(it->second->numel, b + chunk_elems)});
    }
    std::vector<int64_t> hit(chunks.size(), -1);
    dllm__pool pool(std::max(1, std::min(n_threads, (int)chunks.size())));
    pool.run((int)chunks.size(), [&](int i) {
        hit[(size_t)i] = dllm__first_nonfinite(*chunks[(size_t)i].t, chunks[(size_t)i].begin, chunks[(size_t)i].end);
    });
    for (size_t i = 0; i < chunks.size(); i++) {
        if (hit[i] < 0) continue;
        const dllm__tensor &t = *chunks[i].t;
        return dllm__fail(
            DLLM_ERR_FORMAT,
            "%s: tensor %s %s holds %g at flat index %lld: the checkpoint is damaged (non-finite weights)",
            t.file->c_str(), t.name.c_str(), dllm__shape_str(t.shape).c_str(), dllm__tensor_at(t, hit[i]),
            (long long)hit[i]);
    }
    return DLLM_OK;
}

/* The CPU reference's denoising step of one sequence, split around its forward so that the solo step
 * (dllm__cpu_backend::step) and the batched one (dllm__batch_decode) share every line but the forward. */
struct dllm__step_work {
    std::vector<int32_t> cand;  // the candidates: masked positions before the block end, ascending
    int k = 0;                  // a counted rule's count
    double p_transfer = 0;      // DLLM_REMASK_ORIGIN's transfer probability
    int r0 = 0, r1 = 0;         // the logit rows the step reads (shift applied)
};

static void dllm__step_begin(const dllm__decode &st, dllm__step_work &w) {
    w.cand.clear();
    for (int p = 0; p < st.block_end; p++)
        if (st.canvas[(size_t)p] == st.mask_id) w.cand.push_back(p);
    w.k = dllm__step_count(st, (int)w.cand.size());
    w.p_transfer = dllm__timestep_fraction(st.step_in_block, st.steps_per_block, st.unmask.eps);
    // The reference runs the forward even when the step commits nothing; so do we (NFE semantics).
    w.r0 = w.cand.empty() ? st.block_end - 1 : w.cand.front(), w.r1 = st.block_end;
}

/* CFG's unconditional canvas: the prompt's positions masked. */
static void dllm__uncond_canvas(const dllm__decode &st, std::vector<int32_t> &un) {
    un = st.canvas;
    for (size_t p = 0; p < un.size(); p++)
        if (st.is_prompt[p]) un[p] = st.mask_id;
}

/* Tests only: sees the logits (CFG applied) every CPU step chooses from, rows [r0, r1) of the step's canvas. */
static void (*dllm__debug_step_logits)(void *debug_tag, const float *logits, int rows, int n_vocab) = nullptr;

/* The commits of a step whose candidates w.cand have the choices ch (dllm__step_end's, or a backend's: [batch]
 * forward_batch_choose), as the unmasking rule lets them through. */
static void dllm__step_commit(dllm__decode &st, const dllm__step_work &w, const std::vector<dllm__choice> &ch,
                              std::vector<int32_t> &committed) {
    committed.clear();
    for (int i : dllm__select(w.cand, ch, st.unmask, w.k, w.p_transfer)) {
        st.canvas[(size_t)w.cand[(size_t)i]] = ch[(size_t)i].token;
        committed.push_back(w.cand[(size_t)i]);
    }
    st.n_block_left = dllm__count_masks(st, st.block_begin, st.block_end);
}

/* After the step's forwards: CFG's logits = U + (s + 1) (C - U) (uncond null without CFG), then x0 and the
 * confidence at every candidate, and the commits the unmasking rule lets through. */
static void dllm__step_end(dllm__decode &st, const dllm__step_work &w, float *cond, const float *uncond, int V,
                           std::vector<int32_t> &committed) {
    const size_t n = (size_t)(w.r1 - w.r0) * V;
    st.forwards += uncond ? 2 : 1;
    if (uncond) {
        const float scale = st.cfg_scale + 1.0f;
        for (size_t i = 0; i < n; i++) cond[i] = uncond[i] + scale * (cond[i] - uncond[i]);
    }
    if (dllm__debug_step_logits) dllm__debug_step_logits(st.debug_tag, cond, w.r1 - w.r0, V);
    std::vector<dllm__choice> ch;
    for (int32_t p : w.cand)
        ch.push_back(
            dllm__choose(cond + (size_t)(p - w.r0) * V, V, st.sampling, (uint32_t)p, (uint32_t)st.global_step));
    dllm__step_commit(st, w, ch, committed);
}

/* Rows [r0, r1) of logits (shift applied) from the unshifted output rows raw[raw0 ..). */
static void dllm__unshift_rows(const dllm__config &c, const float *raw, int raw0, int r0, int r1, float *out) {
    for (int p = r0; p < r1; p++)
        memcpy(out + (size_t)(p - r0) * c.n_vocab, raw + (size_t)(dllm__logit_row(c, p) - raw0) * c.n_vocab,
               sizeof(float) * c.n_vocab);
}
