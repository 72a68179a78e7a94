/* src/decode/block_diffusion.cpp - block diffusion: Fast-dLLM v2's generate as a state machine. */

// ---- Block diffusion: Fast-dLLM v2's generate (block-diffusion.md) --------------------------------------
// x = prompt; if L > B the prompt's whole blocks are prefilled into the committed K/V cache. Per block: pad x
// with masks to the next multiple of B; the block is x's last B tokens; sub-blocks of S left to right, each
// stepped until it has no mask; the finished block is forwarded once more to append its K/V, and the argmax of
// its last logit row is appended as the next block's first token. Line-by-line twin: tools/make_bd_fixtures.py.

/* Validated options of one block-diffusion generation. */
struct dllm__bd_plan {
    int B = 0, S = 0, n_blocks = 0, max_out = 0;
    double tau = 1.0;  // commit p(x0) > tau, plus the best candidate
    int32_t mask_id = -1, stop_id = -1;
    bool block_cache = false;
    int prefill_mask = 0;  // granularity of the prefill and commit forwards: B, or 1 (token-causal)
    int step_mask = 0;     // granularity of the diffusion-step forwards: the model forward's default
};

/* Options that mean nothing to block diffusion are errors that say so, never silently ignored. */
static dllm_status dllm__check_bd_options(const dllm_gen_params &p) {
    struct {
        bool set;
        const char *what;
    } unsupported[] = {
        {!(p.temperature == 0),
         "temperature (--temp) > 0 (dllm decodes block diffusion greedily, the official default)"},
        {!(p.cfg_scale == 0), "cfg_scale (--cfg)"},
        {dllm__enum_int(p.remasking) != DLLM_REMASK_LOW_CONFIDENCE,
         "remasking (--alg) other than DLLM_REMASK_LOW_CONFIDENCE (--alg low_confidence)"},
        {dllm__enum_int(p.unmask) != DLLM_UNMASK_SCHEDULE && dllm__enum_int(p.unmask) != DLLM_UNMASK_THRESHOLD,
         "an unmasking rule other than the default (one token a step) or DLLM_UNMASK_THRESHOLD (--threshold)"},
        {dllm__enum_int(p.kv_cache) != DLLM_KV_CACHE_NONE,
         "kv_cache (--cache): block diffusion has its own committed-block cache; see block_cache (--block-cache)"},
        {dllm__enum_int(p.dpad) != DLLM_DPAD_OFF, "DPad (--dpad-window, --dpad-uniform)"},
        {!(p.alg_temp == 0), "alg_temp (--alg-temp)"},
        {p.early_stop != 0, "early_stop (--early-stop): block diffusion stops at its stop token"},
        {p.logits_eos_inf != 0, "logits_eos_inf (--logits-eos-inf)"},
        {p.confidence_eos_eot_inf != 0, "confidence_eos_eot_inf (--eos-eot-last)"},
        {p.top_k != 0 || !(p.top_p == 1) || !(p.min_p == 0),
         "the sampler filters top_k (--top-k), top_p (--top-p) and min_p (--min-p): it decodes greedily"},
        {p.eos_id != -1 || p.eot_id != -1, "eos_id or eot_id: block diffusion stops at stop_id (--stop-id)"},
    };
    for (auto &u : unsupported)
        if (u.set) return dllm__fail(DLLM_ERR_UNSUPPORTED, "block diffusion does not take %s", u.what);
    if (dllm__enum_int(p.unmask) == DLLM_UNMASK_THRESHOLD && !(p.threshold > 0 && p.threshold <= 1))
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "threshold (--threshold) must be in (0, 1], got %g",
                          p.threshold);
    if (p.block_cache != 0 && p.block_cache != 1)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "block_cache (--block-cache) must be 0 or 1, got %d",
                          p.block_cache);
    const int lacache = dllm__enum_int(p.lacache);
    if (lacache < DLLM_LACACHE_OFF || lacache > DLLM_LACACHE_ON)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                          "lacache (--lacache) must be DLLM_LACACHE_OFF, _TRUNCATE or _ON, got %d", lacache);
    return DLLM_OK;
}

/* The most ids block diffusion writes after a prompt of n_prompt ids (gen_length a multiple of block B): the official
 * output up to the last AR seed, gen_length + 1 when n_prompt is a multiple of B. */
static int dllm__bd_max_out(int gen_length, int B, int n_prompt) { return gen_length / B * B + 1 - n_prompt % B; }

/* The output capacity a generation needs: what BUFFER_TOO_SMALL reports in *n_out (validated parameters). */
static int dllm__out_needed(const dllm_ctx &ctx, int n_prompt, const dllm_gen_params &p) {
    const bool bd = dllm__is_block_diffusion(ctx.model->cfg) && p.block_length > 0;
    return bd ? dllm__bd_max_out(p.gen_length, p.block_length, n_prompt) : p.gen_length;
}

/* The committed K/V rows a generation needs: the prompt's whole blocks, the generated blocks, one block of slack (the
 * last block's commit). */
static int64_t dllm__bd_cache_rows(int n_prompt, const dllm__bd_plan &plan) {
    return (int64_t)n_prompt / plan.B * plan.B + (int64_t)plan.n_blocks * plan.B + plan.B;
}

/* What fits, for a capacity error: `tokens` of prompt + gen_length at most, and `gen` (a multiple of the block) with
 * this prompt where a block fits. */
static std::string dllm__bd_what_fits(int64_t tokens, int64_t gen) {
    std::string s =
        dllm__format("prompt + gen_length may be %lld tokens at most", (long long)std::max<int64_t>(tokens, 0));
    if (gen > 0) s += dllm__format(" (gen_length %lld with this prompt)", (long long)gen);
    return s;
}

/* The context's positions hold prompt + gen_length (and the last AR seed); the error names what fits. */
static dllm_status dllm__check_bd_length(const dllm_ctx &ctx, int n_prompt, const dllm_gen_params &p, int B) {
    if ((int64_t)n_prompt + p.gen_length + 1 <= ctx.max_tokens) return DLLM_OK;
    return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                      "prompt (%d) + gen_length (-n) %d + 1 tokens exceeds the context's limit of %d (max_tokens; the "
                      "model's positions end at %d): %s",
                      n_prompt, p.gen_length, ctx.max_tokens, ctx.model->cfg.max_seq_len,
                      dllm__bd_what_fits(ctx.max_tokens - 1, (ctx.max_tokens - 1 - n_prompt) / B * B).c_str());
}

/* The committed K/V cache fits what the backend can hold, checked before anything runs; the error names what fits and
 * what to change. */
static dllm_status dllm__check_bd_cache(const dllm_ctx &ctx, int n_prompt, const dllm_gen_params &p,
                                        const dllm__bd_plan &plan) {
    const dllm__config &c = ctx.model->cfg;
    const int B = plan.B;
    const int64_t rows = dllm__bd_cache_rows(n_prompt, plan);
    int64_t fit = 0;
    DLLM__TRY(ctx.impl->bd_rows_that_fit(B, fit));
    if (rows <= fit) return DLLM_OK;
    const int mode = dllm__enum_int(ctx.params.kv_quant);
    const double per_token = dllm__kvq_bytes_per_token(c, mode, B);
    const std::string smaller =
        mode == DLLM_KV_QUANT_NONE
            ? dllm__format("; or quantise the cache (kv_quant, --kv-quant soloq-kv4: %.0f bytes a token)",
                           dllm__kvq_bytes_per_token(c, DLLM_KV_QUANT_SOLOQ_KV4, B))
            : std::string();
    return dllm__fail(
        DLLM_ERR_OUT_OF_MEMORY,
        "the committed K/V cache of prompt (%d) + gen_length (-n) %d needs %lld rows (%.1f MiB at %.0f bytes "
        "a token, kv_quant %s) and the device has room for %lld: %s%s",
        n_prompt, p.gen_length, (long long)rows, rows * per_token / 1048576.0, per_token, dllm__kvq_names[mode],
        (long long)fit, dllm__bd_what_fits(fit - B, (fit - B - (int64_t)n_prompt / B * B) / B * B).c_str(),
        smaller.c_str());
}

static dllm_status dllm__plan_block_diffusion(const dllm_ctx &ctx, const int32_t *prompt, int n_prompt,
                                              const dllm_gen_params &p, int32_t *out, int out_capacity,
                                              dllm__bd_plan &plan) {
    const dllm__config &c = ctx.model->cfg;
    if (n_prompt < 0 || (n_prompt > 0 && !prompt))
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "prompt is NULL or n_prompt < 0");
    DLLM__TRY(dllm__check_bd_options(p));
    plan.B = p.block_length;
    plan.S = p.sub_block_length ? p.sub_block_length : 8;
    if (p.gen_length <= 0 || plan.B <= 0 || p.gen_length % plan.B)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                          "gen_length (-n) %d must be a positive multiple of block_length (--block) %d", p.gen_length,
                          plan.B);
    if (plan.S <= 0 || plan.B % plan.S)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                          "sub_block_length (--sub-block) %d%s must divide block_length (--block) %d", plan.S,
                          p.sub_block_length ? "" : ", the default,", plan.B);
    plan.n_blocks = p.gen_length / plan.B;
    plan.max_out = dllm__bd_max_out(p.gen_length, plan.B, n_prompt);
    DLLM__TRY(dllm__check_bd_length(ctx, n_prompt, p, plan.B));
    if (!out || out_capacity < plan.max_out)
        return dllm__fail(
            !out ? DLLM_ERR_INVALID_ARGUMENT : DLLM_ERR_BUFFER_TOO_SMALL,
            "block diffusion writes up to %d ids for this prompt (gen_length + 1 - n_prompt %% block_length): "
            "the output buffer holds %d",
            plan.max_out, out ? out_capacity : 0);
    DLLM__TRY(dllm__check_token("mask_id (--mask-id)", p.mask_id, c.n_vocab));
    DLLM__TRY(dllm__check_token("stop_id (--stop-id)", p.stop_id, c.n_vocab));
    plan.mask_id = p.mask_id >= 0 ? p.mask_id : c.mask_id;
    plan.stop_id = p.stop_id >= 0 ? p.stop_id : c.stop_id;
    if (plan.mask_id < 0)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                          "the model names no mask token (no |<MASK>| in its tokenizer files, no mask_token_id in "
                          "config.json): set mask_id (--mask-id)");
    for (int i = 0; i < n_prompt; i++) {
        if (prompt[i] < 0 || prompt[i] >= c.n_vocab)
            return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "prompt[%d] = %d is outside the vocabulary [0, %d)", i,
                              prompt[i], c.n_vocab);
        if (prompt[i] == plan.mask_id)
            return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                              "prompt[%d] is the mask id %d: block diffusion decodes only the masks it appends", i,
                              plan.mask_id);
    }
    DLLM__TRY(dllm__check_no_llada2_options(c, p));
    plan.tau = dllm__enum_int(p.unmask) == DLLM_UNMASK_THRESHOLD ? p.threshold : 1.0;
    plan.block_cache = p.block_cache != 0;
    plan.prefill_mask = c.bd_causal_context ? 1 : plan.B;
    plan.step_mask = c.bd_mask_block;
    return dllm__check_bd_cache(ctx, n_prompt, p, plan);
}

/* The state of one block-diffusion generation; x is the official code's input_ids / x_t. The official loop advances
 * one forward at a time so that dllm_generate (run: one sequence, bd_forward / bd_forward_choose) and
 * dllm_generate_batch (dllm__bd_batch_round: every live sequence's next forward in one bd_forward_batch) run the same
 * code: next() walks the loop up to its next forward and describes it, apply_logits (a COMMIT: the prefill or a
 * finished block) or apply_choices (a step) consumes its result. `at` is where the loop stands: PREFILL, BLOCK (the top
 * of block blk's iteration), LOOP (the block's `while not stopped`), SUB (sub-block s0's `while it has a mask`),
 * DONE. */
struct dllm__bd_generation {
    enum phase { PREFILL, BLOCK, LOOP, SUB, DONE };
    dllm_ctx &ctx;
    const dllm_gen_params &p;
    const dllm__bd_plan &plan;
    int n_prompt = 0;
    std::vector<int32_t> x;
    std::vector<float> logits;  // run's: the last bd_forward's rows
    int steps = 0, forwards = 0;
    phase at = PREFILL;
    int blk = 0, pl = 0, bs = 0, s0 = 0,
        step_in_block = 0;  // the block, its prompt/seed end, its start, the sub-block, its steps
    bool block_cache_valid = false;
    dllm__bd_call call;                 // the forward next() described last
    dllm__bd_pick pick;                 // a step's: the rows it chooses
    dllm__step_watch *watch = nullptr;  // a stepper's sequence: every forward's result is recorded there

    dllm__bd_generation(dllm_ctx &c, const dllm_gen_params &params, const dllm__bd_plan &bd_plan, int n)
        : ctx(c), p(params), plan(bd_plan), n_prompt(n) {}

    bool is_mask(size_t i) const { return x[i] == plan.mask_id; }

    /* The first stop token at or after `from`, or -1. */
    int first_stop(int from) const {
        for (size_t i = (size_t)from; plan.stop_id >= 0 && i < x.size(); i++)
            if (x[i] == plan.stop_id) return (int)i;
        return -1;
    }

    /* The official stop rule: a stop token at or after `from` with no mask between `from` and it. */
    bool stopped(int from) const {
        int s = first_stop(from);
        if (s < 0) return false;
        for (int i = from; i < s; i++)
            if (is_mask((size_t)i)) return false;
        return true;
    }

    int masks_in(int begin, int end) const {
        int n = 0;
        for (int i = begin; i < end; i++) n += is_mask((size_t)i);
        return n;
    }

    /* The committed K/V rows the generation needs: the backend's bd_begin, or its batch slot. */
    int cache_rows() const { return (int)dllm__bd_cache_rows(n_prompt, plan); }

    bool done() const { return at == DONE; }

    /* The generation starts at the prompt: a prefill of its whole blocks only if it is strictly longer than a block (a
     * prompt of exactly B is never forwarded). */
    void start(const int32_t *prompt) {
        x.assign(prompt, prompt + n_prompt);
        at = n_prompt > plan.B ? PREFILL : BLOCK, blk = 0;
    }

    dllm__bd_call make_call(dllm__bd_kind kind, int start, int T, int offset, int mask_block, int r0, int r1) {
        dllm__bd_call c;
        c.kind = kind, c.ids = x.data() + start, c.T = T, c.offset = offset, c.mask_block = mask_block, c.r0 = r0,
        c.r1 = r1;
        c.kv_group = plan.B;
        c.lacache = dllm__enum_int(p.lacache) == DLLM_LACACHE_ON;
        return c;
    }

    /* Walks the official loop to its next forward and describes it in seq (call, and pick for a step; seq.slot is the
     * caller's); done() when the generation has no forward left. The forward counts when its result is applied. */
    dllm_status next(dllm__bd_seq &seq) {
        const int B = plan.B, S = plan.S;
        for (;;) {
            switch (at) {
                case PREFILL: {
                    const int P = n_prompt / B * B;
                    call = make_call(DLLM__BD_COMMIT, 0, P, 0, plan.prefill_mask, P - 1, P);
                    break;
                }
                case BLOCK:
                    if (blk == plan.n_blocks ||
                        first_stop(n_prompt) >= 0) {  // also catches an AR seed equal to the stop token
                        at = DONE;
                        continue;
                    }
                    pl = (int)x.size();
                    x.resize((size_t)(pl + B - pl % B), plan.mask_id);
                    bs = (int)x.size() - B, block_cache_valid = false, step_in_block = 0, at = LOOP;
                    continue;
                case LOOP:
                    if (stopped(pl)) {
                        blk++, at = BLOCK;
                        continue;
                    }
                    if (masks_in(bs, bs + B) ==
                        0) {  // the finished block's commit forward; its last row seeds the next block
                        call = make_call(DLLM__BD_COMMIT, bs, B, 0, plan.prefill_mask, B - 1, B);
                        break;
                    }
                    s0 = 0, at = SUB;
                    continue;
                case SUB:
                    if (s0 >= B || stopped(pl)) {
                        at = LOOP;
                        continue;
                    }
                    if (masks_in(bs + s0, bs + s0 + S) == 0) {
                        s0 += S;
                        continue;
                    }
                    if (step_in_block == B)
                        return dllm__fail(DLLM_ERR_INTERNAL, "block %d still has masks after %d steps", blk, B);
                    step_call();  // each step commits at least one mask
                    break;
                case DONE: return DLLM_OK;
            }
            seq.call = call, seq.pick = at == SUB ? &pick : nullptr;
            return DLLM_OK;
        }
    }

    /* The raw output row (relative to logits) that scores row q of a forward starting at r0: the shift maps
     * q to q - 1 and row 0 to itself (block-diffusion.md). */
    int scoring_row(int q, int r0) const { return (ctx.model->cfg.shift_logits && q > 0 ? q - 1 : q) - r0; }

    /* The forward of one diffusion step on sub-block [s0, s0 + S) of the block at bs, and the rows it chooses. */
    void step_call() {
        const int B = plan.B, S = plan.S, shift = ctx.model->cfg.shift_logits ? 1 : 0;
        // dllm's one deliberate change: the mask token is never predicted. Committing it would leave the position
        // masked and the official loop would never end (a trained model gives it ~0 mass).
        pick = dllm__bd_pick();
        pick.sampling.eos_logit_inf = true, pick.sampling.eos_id = plan.mask_id;
        pick.pos0 = bs + s0, pick.n = S;
        auto score_from = [&](int first, int r0) {  // `first`: the forward's first row, as a block offset
            const int q0 = s0 - first;  // the sub-block's first row in the forward: scoring_row(q0 + i, r0) for row i
            pick.shift0 = shift && q0 == 0, pick.lrow0 = scoring_row(q0, r0);
        };
        if (plan.block_cache && block_cache_valid && !is_mask((size_t)(bs + s0))) {
            score_from(s0, 0);
            call = make_call(DLLM__BD_SUB_BLOCK, bs + s0, S, s0, 0, 0, S);
        } else {
            const int r0 = std::max(0, s0 - shift);
            score_from(0, r0);
            call = make_call(plan.block_cache ? DLLM__BD_BLOCK_FULL : DLLM__BD_STEP, bs, B, 0, plan.step_mask, r0,
                             std::max(s0 + S - shift, r0 + 1));
        }
    }

    /* A COMMIT's result (its one raw logit row): the prefill's or the finished block's K/V are committed, and the
     * argmax of the row (the first index on ties, torch's argmax) seeds the next block (after the prefill: only when
     * the prompt ends on a block boundary). A watch sees the seed as the forward's one committed position. */
    dllm_status apply_logits(const float *row) {
        if (at != PREFILL && at != LOOP)
            return dllm__fail(DLLM_ERR_INTERNAL, "block diffusion: logits given to a step");
        forwards++;
        const int V = ctx.model->cfg.n_vocab;
        const int32_t seed = (int32_t)(std::max_element(row, row + V) - row);
        std::vector<int32_t> seeded;
        if (at == LOOP || n_prompt % plan.B == 0) seeded.push_back((int32_t)x.size()), x.push_back(seed);
        if (watch) watch->record(step_info(blk, step_in_block, seeded));
        if (at == LOOP) blk++;
        at = BLOCK;
        return DLLM_OK;
    }

    /* A step's result, the choice of each row of pick (all[i]; only masked rows are read): the masked positions with
     * conf > tau (strict) plus the single highest-conf one (first on ties) are committed, then the step callback. */
    dllm_status apply_choices(const dllm__choice *all) {
        if (at != SUB) return dllm__fail(DLLM_ERR_INTERNAL, "block diffusion: choices given to a commit");
        forwards++;
        if (call.kind != DLLM__BD_SUB_BLOCK) block_cache_valid = plan.block_cache;
        const int i_step = step_in_block++;
        steps++;
        std::vector<int32_t> cand, committed;
        std::vector<dllm__choice> ch;
        int best = -1;
        for (int i = 0; i < plan.S; i++) {
            const int pos = bs + s0 + i;
            if (!is_mask((size_t)pos)) continue;
            cand.push_back(pos);
            ch.push_back(all[i]);
            if (best < 0 || ch.back().conf > ch[(size_t)best].conf) best = (int)ch.size() - 1;  // first on ties
        }
        for (size_t k = 0; k < cand.size(); k++)
            if ((int)k == best || ch[k].conf > plan.tau) {
                x[(size_t)cand[k]] = ch[k].token;
                committed.push_back(cand[k]);
            }
        return report(blk, i_step, committed);
    }

    dllm_step_info step_info(int b, int step_in_b, const std::vector<int32_t> &committed) const {
        return {b,
                plan.n_blocks,
                step_in_b,
                0,
                steps,
                plan.n_blocks * plan.B,
                (int)committed.size(),
                committed.data(),
                x.data(),
                (int)x.size(),
                n_prompt,
                masks_in(n_prompt, (int)x.size())};
    }

    dllm_status report(int b, int step_in_b, const std::vector<int32_t> &committed) {
        if (!p.on_step && !watch) return DLLM_OK;
        return dllm__report_step(p, watch, step_info(b, step_in_b, committed));
    }

    /* A step's forward and the choice of pick's rows (ch[i] for row i; only masked rows matter): on the device where
     * the backend chooses there, else dllm__choose here over the forward's logits (the twin). */
    dllm_status forward_choose(std::vector<dllm__choice> &ch) {
        ch.assign((size_t)pick.n, dllm__choice{0, -INFINITY, false});
        if (ctx.impl->bd_chooses()) return ctx.impl->bd_forward_choose(call, pick, ch.data());
        const int V = ctx.model->cfg.n_vocab;
        logits.resize((size_t)(call.r1 - call.r0) * V);
        DLLM__TRY(ctx.impl->bd_forward(call, logits.data()));
        for (int i = 0; i < pick.n; i++)
            if (is_mask((size_t)(pick.pos0 + i)))
                ch[(size_t)i] = dllm__choose(logits.data() + (size_t)pick.logits_row(i) * V, V, pick.sampling,
                                             (uint32_t)(pick.pos0 + i), 0);
        return DLLM_OK;
    }

    /* dllm_generate: the loop alone on the backend's own committed cache, one forward after another. */
    dllm_status run(const int32_t *prompt) {
        start(prompt);
        DLLM__TRY(ctx.impl->bd_begin(cache_rows()));
        dllm__bd_seq seq;
        std::vector<dllm__choice> ch;
        for (;;) {
            DLLM__TRY(next(seq));
            if (done()) return DLLM_OK;
            if (seq.pick) {
                DLLM__TRY(forward_choose(ch));
                DLLM__TRY(apply_choices(ch.data()));
            } else {
                logits.resize((size_t)(call.r1 - call.r0) * ctx.model->cfg.n_vocab);
                DLLM__TRY(ctx.impl->bd_forward(call, logits.data()));
                DLLM__TRY(apply_logits(logits.data()));
            }
        }
    }

    /* The generated ids: a finished generation's truncated at the first stop token (kept without stop_at_eos, as the
     * official output); a cancelled or failed one's the canvas so far, whatever it holds (dllm_step_fn). */
    int emit(bool finished, bool stop_at_eos, int32_t *out) const {
        int s = finished ? first_stop(n_prompt) : -1, end = s < 0 ? (int)x.size() : stop_at_eos ? s : s + 1;
        for (int i = n_prompt; i < end; i++) out[i - n_prompt] = x[(size_t)i];
        return end - n_prompt;
    }
};

/* A finished (or failed, or cancelled) block-diffusion generation's output and stats; facache: the backend's [FACache]
 * row counts since bd_begin, where it has them for this generation (a batched one: 0, the backend counts no slot). */
static void dllm__bd_result(const dllm__bd_generation &g, dllm_status status, int32_t *out, int *n_out,
                            dllm_gen_stats *stats, double t0, bool facache) {
    int n = g.emit(status == DLLM_OK, g.p.stop_at_eos != 0, out);  // not finished: the canvas so far, uncut
    if (n_out) *n_out = n;
    if (!stats) return;
    stats->n_prompt = g.n_prompt;
    stats->n_generated = n;
    stats->steps = g.steps;
    stats->forwards = g.forwards;
    stats->wall_ms = dllm__now_ms() - t0;
    int64_t rows = 0, reused = 0;
    if (facache) g.ctx.impl->bd_facache_rows(rows, reused);
    stats->facache_rows = (int)std::min<int64_t>(rows, INT32_MAX);
    stats->facache_rows_reused = (int)std::min<int64_t>(reused, INT32_MAX);
}

static dllm_status dllm__bd_generate_impl(dllm_ctx &ctx, const int32_t *prompt, int n_prompt, const dllm_gen_params &p,
                                          int32_t *out, int out_capacity, int *n_out, dllm_gen_stats *stats) {
    dllm__bd_plan plan;
    DLLM__TRY(dllm__plan_block_diffusion(ctx, prompt, n_prompt, p, out, out_capacity, plan));
    double t0 = dllm__now_ms();
    dllm__bd_generation g{ctx, p, plan, n_prompt};
    dllm_status status = g.run(prompt);
    dllm__bd_result(g, status, out, n_out, stats, t0, true);
    return status;
}

/* A finished generation's output (cut at EOS/EoT only when it finished) and stats. */
static void dllm__generation_result(const dllm__generation &g, dllm_status status, int32_t *out, int *n_out,
                                    dllm_gen_stats *stats, double t0) {
    int n = dllm__emit_output(g.full, g.st.n_prompt, g.plan, status == DLLM_OK && g.p.stop_at_eos != 0, out);
    if (n_out) *n_out = n;
    if (stats) {
        stats->n_prompt = g.st.n_prompt;
        stats->n_generated = n;
        stats->steps = g.steps_done;
        stats->forwards = g.st.forwards;
        stats->wall_ms = dllm__now_ms() - t0;
        stats->facache_rows = stats->facache_rows_reused = 0;
    }
}

static dllm_status dllm__generate_impl(dllm_ctx &ctx, const int32_t *prompt, int n_prompt, const dllm_gen_params &p,
                                       int32_t *out, int out_capacity, int *n_out, dllm_gen_stats *stats) {
    if (dllm__is_block_diffusion(ctx.model->cfg))
        return dllm__bd_generate_impl(ctx, prompt, n_prompt, p, out, out_capacity, n_out, stats);
    if (ctx.model->cfg.family == DLLM_FAMILY_LLADA2)
        return dllm__llada2_generate_impl(ctx, prompt, n_prompt, p, out, out_capacity, n_out, stats);
    dllm__gen_plan plan;
    DLLM__TRY(dllm__plan_generation(ctx, prompt, n_prompt, p, out, out_capacity, plan));
    double t0 = dllm__now_ms();
    dllm__generation g{ctx, p, plan, dllm__decode(), {}, 0};
    dllm__init_decode(prompt, n_prompt, p, plan, g.st);
    dllm_status status = g.run();
    dllm__generation_result(g, status, out, n_out, stats, t0);
    return status;
}
