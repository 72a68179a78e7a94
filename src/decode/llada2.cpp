/* src/decode/llada2.cpp - LLaDA2's generate loops (2.0: threshold with the step schedule; 2.1: token editing) over
 * the committed-block K/V cache. The official loops (../shared/spec/llada2.md) recompute the whole prefix at every
 * forward under a block-causal mask; the CPU's block-wise softmax (dllm__cpu_softmax_blocks) makes the cached
 * forward give those bits, which tests/test_llada2.inl checks against the uncached loop (cache = false). */

/* Validated options of one LLaDA2 generation. */
struct dllm__llada2_plan {
    int B = 0, n_blocks = 0;  // blocks of B from position 0 cover prompt + gen_length
    int steps = 0;            // LLaDA2.0: forwards per block at most, min(steps, gen_length)
    bool editing = false;     // LLaDA2.1's loop (edit_threshold >= 0)
    double threshold = 0, edit_threshold = 0;
    int max_post_steps = 16;
    bool eos_early_stop = false, lacache = false;
    bool cache = true;  // committed blocks' K/V cached; false recomputes the prefix, as the official loop (tests)
    int32_t mask_id = -1, eos_id = -1;
};

/* Options that mean nothing to LLaDA2's loops are errors that name them. */
static dllm_status dllm__check_llada2_options(const dllm_gen_params &p) {
    const int unmask = dllm__enum_int(p.unmask);
    struct {
        bool set;
        const char *what;
    } unsupported[] = {
        {!(p.temperature == 0), "temperature (--temp) > 0 (dllm decodes LLaDA2 greedily)"},
        {!(p.cfg_scale == 0), "cfg_scale (--cfg)"},
        {dllm__enum_int(p.remasking) != DLLM_REMASK_LOW_CONFIDENCE,
         "remasking (--alg) other than DLLM_REMASK_LOW_CONFIDENCE (--alg low_confidence)"},
        {unmask != DLLM_UNMASK_SCHEDULE && unmask != DLLM_UNMASK_THRESHOLD,
         "an unmasking rule other than the default schedule or DLLM_UNMASK_THRESHOLD (--threshold): its loops always "
         "take threshold"},
        {dllm__enum_int(p.kv_cache) != DLLM_KV_CACHE_NONE,
         "kv_cache (--cache): it caches the committed blocks by itself"},
        {dllm__enum_int(p.dpad) != DLLM_DPAD_OFF, "DPad (--dpad-window, --dpad-uniform)"},
        {!(p.alg_temp == 0), "alg_temp (--alg-temp)"},
        {p.logits_eos_inf != 0, "logits_eos_inf (--logits-eos-inf)"},
        {p.confidence_eos_eot_inf != 0, "confidence_eos_eot_inf (--eos-eot-last)"},
        {p.top_k != 0 || !(p.top_p == 1) || !(p.min_p == 0),
         "the sampler filters top_k (--top-k), top_p (--top-p) and min_p (--min-p)"},
        {p.eot_id != -1 || p.stop_id != -1, "eot_id or stop_id (--stop-id): it stops at eos_id"},
        {p.sub_block_length != 0 || p.block_cache != 0,
         "sub_block_length (--sub-block) or block_cache (--block-cache), Fast-dLLM v2's"},
        {p.edit_threshold < 0 && p.max_post_steps != -1,
         "max_post_steps (--max-post-steps) without edit_threshold >= 0 (LLaDA2.0's loop has no post steps)"},
    };
    for (auto &u : unsupported)
        if (u.set) return dllm__fail(DLLM_ERR_UNSUPPORTED, "LLaDA2 decoding does not take %s", u.what);
    if (!(p.threshold >= 0 && p.threshold <= 1))
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "threshold (--threshold) must be in [0, 1], got %g",
                          p.threshold);
    if (!(p.edit_threshold < 0 || p.edit_threshold <= 1))
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                          "edit_threshold (--edit-threshold) must be < 0 (LLaDA2.0's loop) or in [0, 1] (LLaDA2.1's), "
                          "got %g",
                          p.edit_threshold);
    if (p.max_post_steps < -1)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                          "max_post_steps (--max-post-steps) must be >= 0, or -1 for the default 16, got %d",
                          p.max_post_steps);
    const int lacache = dllm__enum_int(p.lacache);
    if (lacache < DLLM_LACACHE_OFF || lacache > DLLM_LACACHE_ON)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                          "lacache (--lacache) must be DLLM_LACACHE_OFF, _TRUNCATE or _ON, got %d", lacache);
    return DLLM_OK;
}

/* The lengths: positive, the block-aligned canvas inside the context, the output buffer of gen_length ids. */
static dllm_status dllm__plan_llada2_lengths(const dllm_ctx &ctx, int n_prompt, const dllm_gen_params &p, int32_t *out,
                                             int out_capacity, dllm__llada2_plan &plan) {
    if (p.gen_length <= 0 || p.block_length <= 0 || (!plan.editing && p.steps <= 0))
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                          "gen_length (-n) %d, block_length (--block) %d and steps (--steps) %d must be positive",
                          p.gen_length, p.block_length, p.steps);
    plan.B = p.block_length;
    const int64_t canvas = ((int64_t)n_prompt + p.gen_length + plan.B - 1) / plan.B * plan.B;
    if (canvas > ctx.max_tokens)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                          "prompt (%d) + gen_length (-n) %d rounded up to whole blocks of %d is %lld tokens, over the "
                          "context's limit of %d",
                          n_prompt, p.gen_length, plan.B, (long long)canvas, ctx.max_tokens);
    plan.n_blocks = (int)(canvas / plan.B);
    plan.steps =
        std::min(p.steps, p.gen_length);  // the official min(steps, gen_length // minimal_topk), minimal_topk 1
    if (!out || out_capacity < p.gen_length)
        return dllm__fail(!out ? DLLM_ERR_INVALID_ARGUMENT : DLLM_ERR_BUFFER_TOO_SMALL,
                          "the output buffer must hold gen_length (-n) = %d ids (capacity %d)", p.gen_length,
                          out ? out_capacity : 0);
    return DLLM_OK;
}

static dllm_status dllm__plan_llada2(const dllm_ctx &ctx, const int32_t *prompt, int n_prompt, const dllm_gen_params &p,
                                     int32_t *out, int out_capacity, dllm__llada2_plan &plan) {
    const dllm__config &c = ctx.model->cfg;
    if (n_prompt < 0 || (n_prompt > 0 && !prompt))
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "prompt is NULL or n_prompt < 0");
    DLLM__TRY(dllm__check_llada2_options(p));
    plan.editing = p.edit_threshold >= 0;
    DLLM__TRY(dllm__plan_llada2_lengths(ctx, n_prompt, p, out, out_capacity, plan));
    DLLM__TRY(dllm__check_token("mask_id (--mask-id)", p.mask_id, c.n_vocab));
    DLLM__TRY(dllm__check_token("eos_id", p.eos_id, c.n_vocab));
    plan.mask_id = p.mask_id >= 0 ? p.mask_id : c.mask_id;
    plan.eos_id = p.eos_id >= 0 ? p.eos_id : c.eos_id;
    for (int i = 0; i < n_prompt; i++) {
        if (prompt[i] < 0 || prompt[i] >= c.n_vocab)
            return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "prompt[%d] = %d is outside the vocabulary [0, %d)", i,
                              prompt[i], c.n_vocab);
        if (prompt[i] == plan.mask_id)
            return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                              "prompt[%d] is the mask id %d: LLaDA2 decodes only the masks it appends", i,
                              plan.mask_id);
    }
    plan.threshold = p.threshold;
    plan.edit_threshold = p.edit_threshold;
    plan.max_post_steps = p.max_post_steps >= 0 ? p.max_post_steps : 16;
    plan.eos_early_stop = p.early_stop != 0;
    plan.lacache = dllm__enum_int(p.lacache) == DLLM_LACACHE_ON;
    return DLLM_OK;
}

/* One LLaDA2 generation: x is the official code's canvas, blocks [bs, bs + B) from position 0. A state machine, so
 * that a stepper can batch it (decode/batch_bd.cpp): next() names the next forward (a commit of rows to the K/V cache,
 * or a step's forward of the block with its pick), apply_logits() or apply_choices() takes its result and decides;
 * run() is the loop of one generation alone over the same calls, so a sequence decodes the same alone and in a batch
 * whenever the backend's batched forward gives it bd_forward's logits. */
struct dllm__llada2_generation {
    enum phase { START, BLOCK_BEGIN, IN_BLOCK, BLOCK_END, DONE };
    dllm_ctx &ctx;
    const dllm_gen_params &p;
    const dllm__llada2_plan &plan;
    int n_prompt = 0;
    std::vector<int32_t> x;
    std::vector<float> logits;
    std::vector<dllm__choice> ch;  // the current block's rows after a step's forward
    int steps = 0, forwards = 0, block = 0, bs = 0;
    dllm__step_watch *watch = nullptr;  // a stepper's sequence: every step is recorded there
    phase at = START;
    dllm__bd_call pending;            // the forward next() named
    dllm__bd_pick pick;               // a step's choice: every row of the block, greedy, the mask id never predicted
    int step_in_block = 0, post = 0;  // the block's step; LLaDA2.1's forwards after its last mask
    int n_masks = 0;                  // LLaDA2.1: the block's masks before the pending step
    std::vector<uint8_t> was_mask;    // LLaDA2.1: which rows were masks before the pending step

    dllm__llada2_generation(dllm_ctx &c, const dllm_gen_params &params, const dllm__llada2_plan &pl, int n)
        : ctx(c), p(params), plan(pl), n_prompt(n) {}

    bool is_mask(int i) const { return x[(size_t)i] == plan.mask_id; }
    int masks_in(int begin, int end) const {
        int n = 0;
        for (int i = begin; i < end; i++) n += is_mask(i);
        return n;
    }
    /* The first EOS of the generated part before `end`, or -1. */
    int first_eos(int end) const {
        for (int i = n_prompt; i < end; i++)
            if (x[(size_t)i] == plan.eos_id) return i;
        return -1;
    }
    bool done() const { return at == DONE; }
    int cache_rows() const { return plan.n_blocks * plan.B; }  // what bd_begin / a batch slot holds

    dllm__bd_call make_call(dllm__bd_kind kind, int start, int T, int r0, int r1) const {
        dllm__bd_call c;
        c.kind = kind, c.ids = x.data() + start, c.T = T, c.mask_block = plan.B, c.r0 = r0, c.r1 = r1;
        c.lacache = plan.lacache;
        return c;
    }
    /* Rows [start, start + T) become committed K/V (the prompt's whole blocks, a finished block): one logit row. */
    dllm__bd_call commit_call(int start, int T) const { return make_call(DLLM__BD_COMMIT, start, T, T - 1, T); }
    /* A step's forward: the B rows of the current block (without the cache, the whole prefix from position 0). */
    dllm__bd_call step_call() const {
        return plan.cache ? make_call(DLLM__BD_STEP, bs, plan.B, 0, plan.B)
                          : make_call(DLLM__BD_STEP, 0, bs + plan.B, bs, bs + plan.B);
    }

    /* Block offsets of the masks, the most confident first (ties to the lower position), at most k of them. */
    std::vector<int> top_masks(int k) const {
        std::vector<int> idx;
        for (int i = 0; i < plan.B; i++)
            if (is_mask(bs + i)) idx.push_back(i);
        auto before = [&](int a, int b) {
            return ch[(size_t)a].conf > ch[(size_t)b].conf || (ch[(size_t)a].conf == ch[(size_t)b].conf && a < b);
        };
        k = std::min(k, (int)idx.size());
        std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), before);
        idx.resize((size_t)k);
        return idx;
    }

    /* The masks with p(x0) > threshold if there are at least `least` of them, else the `least` most confident. */
    std::vector<int> masks_to_commit(int least) const {
        std::vector<int> sure;
        for (int i = 0; i < plan.B; i++)
            if (is_mask(bs + i) && ch[(size_t)i].conf > plan.threshold) sure.push_back(i);
        return (int)sure.size() >= least ? sure : top_masks(least);
    }

    /* Writes x0 at the block offsets `at`; returns their canvas positions, ascending. */
    std::vector<int32_t> write(std::vector<int> at) {
        std::sort(at.begin(), at.end());
        std::vector<int32_t> pos;
        for (int i : at) x[(size_t)(bs + i)] = ch[(size_t)i].token, pos.push_back(bs + i);
        return pos;
    }

    dllm_status report(int s, const std::vector<int32_t> &written) {
        steps++;
        if (!p.on_step && !watch) return DLLM_OK;
        dllm_step_info info = {block,
                               plan.n_blocks,
                               s,
                               plan.editing ? 0 : plan.steps,
                               steps,
                               plan.n_blocks * plan.B,
                               (int)written.size(),
                               written.data(),
                               x.data(),
                               (int)x.size(),
                               n_prompt,
                               masks_in(n_prompt, (int)x.size())};
        return dllm__report_step(p, watch, info);
    }

    /* LLaDA2.0's early stop: a committed EOS and no mask before the first EOS. */
    bool eos_early_stop(const std::vector<int32_t> &written) const {
        bool wrote_eos = false;
        for (int32_t pos : written) wrote_eos = wrote_eos || x[(size_t)pos] == plan.eos_id;
        const int eos = wrote_eos ? first_eos((int)x.size()) : -1;
        return eos >= 0 && masks_in(n_prompt, eos) == 0;
    }

    /* LLaDA2.1's edits: decoded, non-prompt rows of the block (not masked before this step) whose x0 differs from
     * their token and has p > edit_threshold. */
    std::vector<int> edits() const {
        std::vector<int> at;
        for (int i = 0; i < plan.B; i++)
            if (!was_mask[(size_t)i] && bs + i >= n_prompt && ch[(size_t)i].conf > plan.edit_threshold &&
                ch[(size_t)i].token != x[(size_t)(bs + i)])
                at.push_back(i);
        return at;
    }

    /* The official stop after a block: 2.0 at any EOS in the generated part; 2.1 with early_stop at one there once
     * the generated part has no mask. */
    bool stop_after_block() const {
        const int end = bs + plan.B;
        if (first_eos(end) < 0) return false;
        return !plan.editing || (plan.eos_early_stop && masks_in(n_prompt, end) == 0);
    }

    /* The canvas: the prompt, masks after it, whole blocks. */
    void start(const int32_t *prompt) {
        x.assign(prompt, prompt + n_prompt);
        x.resize((size_t)plan.n_blocks * plan.B, plan.mask_id);
        at = START;
    }

    /* Walks to the next forward (call) or to the end (done()). LLaDA2.0's block: at most plan.steps forwards while
     * masks remain, step s committing by the schedule k_s = B / steps (+1 for s < B % steps). LLaDA2.1's block:
     * forwards commit masks (threshold, at least one) and edit; after the last mask up to max_post_steps more forwards,
     * ending at the first that edits nothing. */
    dllm_status next(dllm__bd_call &call) {
        const int B = plan.B;
        for (;;) switch (at) {
            case START: {
                const int first = n_prompt / B;
                block = first, at = BLOCK_BEGIN;
                if (plan.cache && first > 0) return call = pending = commit_call(0, first * B), DLLM_OK;
                break;
            }
            case BLOCK_BEGIN:
                if (block >= plan.n_blocks) {
                    at = DONE;
                    return DLLM_OK;
                }
                bs = block * B, step_in_block = 0, post = 0, at = IN_BLOCK;
                break;
            case IN_BLOCK:
                if (!plan.editing) {
                    if (step_in_block < plan.steps && masks_in(bs, bs + B) > 0) return step_forward(call);
                    at = BLOCK_END;
                    break;
                }
                was_mask.resize((size_t)B);
                n_masks = 0;
                for (int i = 0; i < B; i++) n_masks += was_mask[(size_t)i] = is_mask(bs + i);
                if (n_masks == 0 && ++post > plan.max_post_steps) {
                    at = BLOCK_END;
                    break;
                }
                return step_forward(call);
            case BLOCK_END:
                if (stop_after_block()) {
                    at = DONE;
                    return DLLM_OK;
                }
                if (plan.cache && block + 1 < plan.n_blocks) {
                    block++, at = BLOCK_BEGIN;  // after this commit of the finished block
                    return call = pending = commit_call(bs, B), DLLM_OK;
                }
                block++, at = BLOCK_BEGIN;
                break;
            case DONE:
                return DLLM_OK;
        }
    }

    /* A step's forward: its call and its pick (the block's B rows, position bs + i, step 0 of dllm__choose). */
    dllm_status step_forward(dllm__bd_call &call) {
        call = pending = step_call();
        pick = dllm__bd_pick();
        pick.sampling.eos_logit_inf = true, pick.sampling.eos_id = plan.mask_id;
        pick.pos0 = bs, pick.n = plan.B;
        return DLLM_OK;
    }
    bool step_pending() const { return pending.kind != DLLM__BD_COMMIT; }

    /* The pending forward's logits (a commit's one row: unused; a step's B rows): the step's choices by dllm__choose
     * over them (the pick's), then apply_choices. */
    dllm_status apply_logits(const float *rows) {
        if (!step_pending()) {
            forwards++;
            return DLLM_OK;
        }
        const int V = ctx.model->cfg.n_vocab;
        std::vector<dllm__choice> chosen((size_t)pick.n);
        for (int i = 0; i < pick.n; i++)
            chosen[(size_t)i] = dllm__choose(rows + (size_t)pick.logits_row(i) * V, V, pick.sampling,
                                             (uint32_t)(pick.pos0 + i), 0);
        return apply_choices(chosen.data());
    }

    /* A step's choices (every row of the block, as dllm__choose makes them, on the host or on the device where the
     * backend chooses there): what they commit and edit. */
    dllm_status apply_choices(const dllm__choice *chosen) {
        forwards++;
        const int B = plan.B;
        ch.assign(chosen, chosen + B);
        const int s = step_in_block++;
        if (!plan.editing) {
            const int k = B / plan.steps + (s < B % plan.steps ? 1 : 0);
            const std::vector<int32_t> written = write(masks_to_commit(k));
            DLLM__TRY(report(s, written));
            if (plan.eos_early_stop && eos_early_stop(written)) at = DONE;
            return DLLM_OK;
        }
        std::vector<int> to_write = n_masks > 0 ? masks_to_commit(1) : std::vector<int>();
        const std::vector<int> edited = edits();
        to_write.insert(to_write.end(), edited.begin(), edited.end());
        DLLM__TRY(report(s, write(to_write)));
        if (n_masks == 0 && edited.empty()) at = BLOCK_END;
        return DLLM_OK;
    }

    /* The generation alone: bd_forward on the context's own cache. */
    dllm_status run(const int32_t *prompt) {
        start(prompt);
        DLLM__TRY(ctx.impl->bd_begin(cache_rows()));
        const int V = ctx.model->cfg.n_vocab;
        for (;;) {
            dllm__bd_call call;
            DLLM__TRY(next(call));
            if (done()) return DLLM_OK;
            // the device's choice, no logits to the host (bd_forward_choose takes one LM-head chunk of rows)
            if (step_pending() && ctx.impl->bd_chooses() && pick.n <= dllm__lm_chunk_rows) {
                std::vector<dllm__choice> chosen((size_t)pick.n, dllm__choice{0, -INFINITY, false});
                DLLM__TRY(ctx.impl->bd_forward_choose(call, pick, chosen.data()));
                DLLM__TRY(apply_choices(chosen.data()));
                continue;
            }
            logits.resize((size_t)(call.r1 - call.r0) * V);
            DLLM__TRY(ctx.impl->bd_forward(call, logits.data()));
            DLLM__TRY(apply_logits(logits.data()));
        }
    }

    /* The generated ids: the first gen_length, a finished generation's cut at its first EOS (kept without
     * stop_at_eos); a cancelled or failed one's canvas so far. */
    int emit(bool finished, int32_t *out) const {
        const int end = n_prompt + p.gen_length, eos = finished ? first_eos(end) : -1;
        const int n = eos < 0 ? p.gen_length : eos - n_prompt + (p.stop_at_eos ? 0 : 1);
        for (int i = 0; i < n; i++) out[i] = x[(size_t)(n_prompt + i)];
        return n;
    }
};

/* A generation's output and stats (t0: when it started). */
static void dllm__llada2_result(const dllm__llada2_generation &g, dllm_status status, int32_t *out, int *n_out,
                                dllm_gen_stats *stats, double t0) {
    const int n = g.emit(status == DLLM_OK, out);
    if (n_out) *n_out = n;
    if (stats) {
        memset(stats, 0, sizeof *stats);
        stats->n_prompt = g.n_prompt, stats->n_generated = n, stats->steps = g.steps, stats->forwards = g.forwards;
        stats->wall_ms = dllm__now_ms() - t0;
    }
}

static dllm_status dllm__llada2_generate_plan(dllm_ctx &ctx, const int32_t *prompt, int n_prompt,
                                              const dllm_gen_params &p, const dllm__llada2_plan &plan, int32_t *out,
                                              int *n_out, dllm_gen_stats *stats) {
    const double t0 = dllm__now_ms();
    dllm__llada2_generation g{ctx, p, plan, n_prompt};
    const dllm_status status = g.run(prompt);
    dllm__llada2_result(g, status, out, n_out, stats, t0);
    return status;
}

static dllm_status dllm__llada2_generate_impl(dllm_ctx &ctx, const int32_t *prompt, int n_prompt,
                                              const dllm_gen_params &p, int32_t *out, int out_capacity, int *n_out,
                                              dllm_gen_stats *stats) {
    dllm__llada2_plan plan;
    DLLM__TRY(dllm__plan_llada2(ctx, prompt, n_prompt, p, out, out_capacity, plan));
    return dllm__llada2_generate_plan(ctx, prompt, n_prompt, p, plan, out, n_out, stats);
}
