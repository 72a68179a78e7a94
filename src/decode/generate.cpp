/* src/decode/generate.cpp - decoding: the plan, option checks and the semi-autoregressive generation. */

// ---------------------------------------------------------------------------------------------------
// 17. SAR decoding (LLaDA generate.py)
//     x = prompt ++ [MASK] * G; for each block, n masks get s steps, k_i = n / s (+1 for the first n % s
//     steps); each step commits the top k_i candidates (masked positions before the block end).
// ---------------------------------------------------------------------------------------------------

}  // namespace
struct dllm_ctx {
    dllm_model *model = nullptr;
    dllm_ctx_params params;
    dllm_backend backend = DLLM_BACKEND_CPU;
    int max_tokens = 0;
    std::string last_error;
    std::unique_ptr<dllm__backend_impl> impl;
    dllm_stepper *stepper = nullptr;  // the one stepper using the backend's batch slots (dllm_generate_batch runs one)
};
namespace {

struct dllm__gen_plan {
    int n_blocks = 0, steps_per_block = 0;  // steps_per_block 0: threshold/factor (data-dependent)
    int32_t mask_id = 0, eos_id = -1, eot_id = -1;
};

static dllm_status dllm__check_token(const char *what, int32_t id, int n_vocab) {
    if (id < -1 || id >= n_vocab)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "%s %d is outside the vocabulary [0, %d)", what, id, n_vocab);
    return DLLM_OK;
}

static bool dllm__finite_in(double v, double lo, double hi) { return v >= lo && v <= hi; }  // false for NaN

/* tuned_forwards is a switch (dllm_generate's own forwards on the GPU), meaningful to every family. */
static dllm_status dllm__check_tuned_forwards(const dllm_gen_params &p) {
    if (p.tuned_forwards == 0 || p.tuned_forwards == 1) return DLLM_OK;
    return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "tuned_forwards (--tuned-forwards) must be 0 or 1, got %d",
                      p.tuned_forwards);
}

/* edit_threshold and max_post_steps mean something to LLaDA2's loops only: other families refuse them. */
static dllm_status dllm__check_no_llada2_options(const dllm__config &c, const dllm_gen_params &p) {
    if (p.edit_threshold < 0 && p.max_post_steps == -1) return DLLM_OK;
    return dllm__fail(DLLM_ERR_UNSUPPORTED,
                      "edit_threshold and max_post_steps (--edit-threshold, --max-post-steps) belong to LLaDA2's "
                      "decoding; a %s model does not take them",
                      dllm__family_name(c.family));
}

/* Dream's sampler options (decoding.md 4): ranges, and the combinations that mean something. The remasking
 * and unmask values are already validated. */
static dllm_status dllm__check_dream(const dllm_gen_params &p) {
    const int unmask = dllm__enum_int(p.unmask), remasking = dllm__enum_int(p.remasking);
    const bool counted = unmask == DLLM_UNMASK_SCHEDULE || unmask == DLLM_UNMASK_TIMESTEPS;
    if (unmask == DLLM_UNMASK_TIMESTEPS && !(p.eps > 0 && p.eps < 1))
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "eps (--eps) must be in (0, 1), got %g", p.eps);
    if (!(p.alg_temp >= 0 && p.alg_temp <= DBL_MAX))
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "alg_temp (--alg-temp) must be finite and >= 0, got %g",
                          p.alg_temp);
    if (remasking == DLLM_REMASK_ORIGIN && unmask != DLLM_UNMASK_TIMESTEPS)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                          "DLLM_REMASK_ORIGIN (--alg origin) transfers each mask with the probability of Dream's "
                          "timestep schedule: it needs DLLM_UNMASK_TIMESTEPS (--timesteps)");
    if (remasking == DLLM_REMASK_ORIGIN && p.confidence_eos_eot_inf)
        return dllm__fail(
            DLLM_ERR_INVALID_ARGUMENT,
            "DLLM_REMASK_ORIGIN (--alg origin) does not rank candidates, so confidence_eos_eot_inf (--eos-eot-last) "
            "cannot put EOS/EoT last");
    if (p.alg_temp > 0 && (!counted || remasking == DLLM_REMASK_ORIGIN))
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                          "alg_temp (--alg-temp) samples the k positions of a counted step (the default schedule or "
                          "DLLM_UNMASK_TIMESTEPS (--timesteps)); DLLM_UNMASK_THRESHOLD (--threshold), "
                          "DLLM_UNMASK_FACTOR (--factor) and DLLM_REMASK_ORIGIN (--alg origin) have no k to sample");
    return DLLM_OK;
}

/* DLLM_UNMASK_THRESHOLD's tau: a probability, or with ENTROPY a bound on sum p log p <= 0 (minus the entropy). */
static dllm_status dllm__check_threshold(const dllm_gen_params &p) {
    if (dllm__enum_int(p.remasking) != DLLM_REMASK_ENTROPY) {
        if (!(p.threshold > 0 && p.threshold <= 1))
            return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "threshold (--threshold) must be in (0, 1], got %g",
                              p.threshold);
    } else if (!(p.threshold <= 0 && p.threshold >= -DBL_MAX)) {
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                          "with DLLM_REMASK_ENTROPY (--alg entropy) the confidence is sum p log p <= 0 (minus the "
                          "entropy in nats): threshold (--threshold) must be finite and <= 0 (e.g. -0.5), got %g",
                          p.threshold);
    }
    return DLLM_OK;
}

/* The sampler filters: each off or inside its range (dllm.h). */
static dllm_status dllm__check_filters(const dllm_gen_params &p) {
    if (p.top_k < 0)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "top_k (--top-k) must be >= 0 (0 = off), got %d", p.top_k);
    if (!(p.top_p > 0 && p.top_p <= 1))
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "top_p (--top-p) must be in (0, 1] (1 = off), got %g",
                          (double)p.top_p);
    if (!(p.min_p >= 0 && p.min_p <= 1))
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "min_p (--min-p) must be in [0, 1] (0 = off), got %g",
                          (double)p.min_p);
    return DLLM_OK;
}

/* The schedule options beyond LLaDA's (Fast-dLLM, DPad, Dream): ranges and combinations. */
static dllm_status dllm__check_schedulers(const dllm_gen_params &p, const int32_t *prompt, int n_prompt,
                                          int32_t mask_id) {
    int unmask = dllm__enum_int(p.unmask), kv = dllm__enum_int(p.kv_cache), dpad = dllm__enum_int(p.dpad);
    if (unmask < DLLM_UNMASK_SCHEDULE || unmask > DLLM_UNMASK_TIMESTEPS)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                          "unmask must be DLLM_UNMASK_SCHEDULE, _THRESHOLD, _FACTOR or _TIMESTEPS, got %d", unmask);
    if (unmask == DLLM_UNMASK_THRESHOLD) DLLM__TRY(dllm__check_threshold(p));
    if (unmask == DLLM_UNMASK_FACTOR && !dllm__finite_in(p.factor, 1e-9, 1e9))
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "factor (--factor) must be > 0, got %g", p.factor);
    if (kv < DLLM_KV_CACHE_NONE || kv > DLLM_KV_CACHE_DUAL)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "kv_cache must be DLLM_KV_CACHE_NONE, _PREFIX or _DUAL, got %d",
                          kv);
    if (kv != DLLM_KV_CACHE_NONE)
        for (int i = 0; i < n_prompt; i++)
            if (prompt[i] == mask_id)
                return dllm__fail(
                    DLLM_ERR_INVALID_ARGUMENT,
                    "the prompt has a [MASK] at %d: with a K/V cache only the block's rows are recomputed, "
                    "so masks outside it cannot be decoded: use DLLM_KV_CACHE_NONE (--cache none)",
                    i);
    if (dpad < DLLM_DPAD_OFF || dpad > DLLM_DPAD_UNIFORM)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dpad must be DLLM_DPAD_OFF, _GAUSSIAN or _UNIFORM, got %d", dpad);
    if (dpad == DLLM_DPAD_GAUSSIAN &&
        (p.dpad_window < 2 || !dllm__finite_in(p.dpad_k, 0, 1e6) || !dllm__finite_in(p.dpad_scale, 0, 1e6)))
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                          "DPad (Gaussian) needs dpad_window (--dpad-window) >= 2, dpad_k (--dpad-k) >= 0 and "
                          "dpad_scale (--dpad-scale) >= 0 (got %d, %g, %g)",
                          p.dpad_window, (double)p.dpad_k, (double)p.dpad_scale);
    if (dpad == DLLM_DPAD_UNIFORM && (p.dpad_window < 1 || p.dpad_n < 0))
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                          "DPad (uniform) needs dpad_window (--dpad-window) >= 1 and dpad_n (--dpad-uniform) >= 0 "
                          "(got %d, %d)",
                          p.dpad_window,
                          p.dpad_n);
    return dllm__check_dream(p);
}

static dllm_status dllm__plan_generation(const dllm_ctx &ctx, const int32_t *prompt, int n_prompt,
                                         const dllm_gen_params &p, int32_t *out, int out_capacity,
                                         dllm__gen_plan &plan) {
    const dllm__config &c = ctx.model->cfg;
    if (n_prompt < 0 || (n_prompt > 0 && !prompt))
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "prompt is NULL or n_prompt < 0");
    const int unmask = dllm__enum_int(p.unmask);  // read as int: the value is not validated yet
    const bool scheduled = unmask == DLLM_UNMASK_SCHEDULE || unmask == DLLM_UNMASK_TIMESTEPS;  // steps fixed per block
    if (p.gen_length <= 0 || p.block_length <= 0 || (scheduled && p.steps <= 0))
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                          "gen_length (-n) %d, block_length (--block) %d and steps (--steps) %d must be positive",
                          p.gen_length,
                          p.block_length, p.steps);
    if (p.gen_length % p.block_length)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                          "gen_length (-n) %d is not a multiple of block_length (--block) %d", p.gen_length,
                          p.block_length);
    // The schedule splits a block's masks (block_length or more) over its steps: with steps <= gen_length, that is
    // steps_per_block <= block_length, every step commits a token; each further step would commit nothing.
    if (scheduled && p.steps > p.gen_length)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                          "steps (--steps) %d is more than gen_length (-n) %d: at most %d steps (one token a step) "
                          "commit anything",
                          p.steps, p.gen_length, p.gen_length);
    plan.n_blocks = p.gen_length / p.block_length;
    if (scheduled && p.steps % plan.n_blocks)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                          "steps (--steps) %d is not a multiple of the number of blocks %d (gen_length (-n) / "
                          "block_length (--block))",
                          p.steps, plan.n_blocks);
    plan.steps_per_block = scheduled ? p.steps / plan.n_blocks : 0;
    if ((int64_t)n_prompt + p.gen_length > ctx.max_tokens)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                          "prompt (%d) + gen_length (-n) %d = %lld tokens exceeds the context's limit of %d",
                          n_prompt, p.gen_length, (long long)n_prompt + p.gen_length, ctx.max_tokens);
    if (!(p.temperature >= 0 && p.temperature <= FLT_MAX))
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "temperature (--temp) must be finite and >= 0, got %g",
                          (double)p.temperature);
    if (!(p.cfg_scale >= 0) || !(p.cfg_scale < 1e6))
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "cfg_scale (--cfg) must be in [0, 1e6), got %g",
                          (double)p.cfg_scale);
    DLLM__TRY(dllm__check_filters(p));
    int lacache = dllm__enum_int(p.lacache);
    if (lacache < DLLM_LACACHE_OFF || lacache > DLLM_LACACHE_ON)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                          "lacache (--lacache) must be DLLM_LACACHE_OFF, _TRUNCATE or _ON, got %d", lacache);
    int remasking = dllm__enum_int(p.remasking);
    if (remasking < DLLM_REMASK_LOW_CONFIDENCE || remasking > DLLM_REMASK_ORIGIN)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                          "remasking (--alg) must be DLLM_REMASK_LOW_CONFIDENCE, _RANDOM, _MARGIN, _ENTROPY or "
                          "_ORIGIN, got %d",
                          remasking);
    if (!out || out_capacity < p.gen_length)
        return dllm__fail(!out ? DLLM_ERR_INVALID_ARGUMENT : DLLM_ERR_BUFFER_TOO_SMALL,
                          "the output buffer must hold gen_length (-n) = %d ids (capacity %d)", p.gen_length,
                          out ? out_capacity : 0);
    DLLM__TRY(dllm__check_token("mask_id (--mask-id)", p.mask_id, c.n_vocab));
    DLLM__TRY(dllm__check_token("eos_id", p.eos_id, c.n_vocab));
    DLLM__TRY(dllm__check_token("eot_id", p.eot_id, c.n_vocab));
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= c.n_vocab)
            return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "prompt[%d] = %d is outside the vocabulary [0, %d)", i,
                              prompt[i], c.n_vocab);
    plan.mask_id = p.mask_id >= 0 ? p.mask_id : c.mask_id;
    plan.eos_id = p.eos_id >= 0 ? p.eos_id : c.eos_id;
    plan.eot_id = p.eot_id >= 0 ? p.eot_id : c.eot_id;
    if (p.early_stop && plan.eos_id < 0 && plan.eot_id < 0)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                          "early_stop (--early-stop) needs an EOS or EoT id (the model has none; set eos_id)");
    DLLM__TRY(dllm__check_no_llada2_options(c, p));
    return dllm__check_schedulers(p, prompt, n_prompt, plan.mask_id);
}

static void dllm__init_decode(const int32_t *prompt, int n_prompt, const dllm_gen_params &p, const dllm__gen_plan &plan,
                              dllm__decode &st) {
    st.n_prompt = n_prompt;
    st.mask_id = plan.mask_id;
    st.cfg_scale = p.cfg_scale;
    st.canvas.assign(prompt, prompt + n_prompt);
    st.canvas.resize((size_t)n_prompt + p.gen_length, plan.mask_id);
    st.is_prompt.assign(st.canvas.size(), 0);
    for (int i = 0; i < n_prompt; i++) st.is_prompt[(size_t)i] = prompt[i] != plan.mask_id;
    st.sampling.temperature = p.temperature;
    st.sampling.remasking = p.remasking;
    // Dream's confidences use its tempered softmax; LOW_CONFIDENCE keeps LLaDA's untempered one unless it runs
    // as Dream's maskgit_plus, under the timestep schedule.
    st.sampling.tempered_conf = p.remasking == DLLM_REMASK_MARGIN || p.remasking == DLLM_REMASK_ENTROPY ||
                                (p.remasking == DLLM_REMASK_LOW_CONFIDENCE && p.unmask == DLLM_UNMASK_TIMESTEPS);
    st.sampling.alg_temp = p.alg_temp;
    st.sampling.seed = p.seed;
    st.sampling.eos_logit_inf = p.logits_eos_inf != 0 && plan.eos_id >= 0;
    st.sampling.defer_eos_eot = p.confidence_eos_eot_inf != 0;
    st.sampling.eos_id = plan.eos_id;
    st.sampling.eot_id = plan.eot_id;
    st.sampling.top_k = p.top_k;
    st.sampling.top_p = p.top_p;
    st.sampling.min_p = p.min_p;
    st.lacache = p.lacache;
    st.unmask.kind = p.unmask;
    st.unmask.threshold = p.threshold;
    st.unmask.factor = p.factor;
    st.unmask.eps = p.eps;
    st.unmask.origin = p.remasking == DLLM_REMASK_ORIGIN;
    st.kv_cache = p.kv_cache;
    st.steps_per_block = plan.steps_per_block;
    st.debug_tag = p.on_step_data;
}

/* DPad (decoding.md 3): the suffix positions a block keeps, ascending. Gaussian: distance d in [0, W) from
 * the block end is kept with probability a * phi(k d / (W - 1)); uniform: the n positions of the window
 * with the smallest draws. Draws come from stream DLLM__RNG_DPAD keyed by (d, position, block): the same
 * seed keeps the same positions on every backend. */
static std::vector<int32_t> dllm__dpad_keep(const dllm_gen_params &p, int block_end, int canvas_end, int block) {
    const int window = std::min(p.dpad_window, canvas_end - block_end);
    std::vector<std::pair<double, int32_t>> draws;
    for (int d = 0; d < window; d++)
        draws.push_back({dllm__uniform(p.seed, (uint32_t)d, (uint32_t)(block_end + d), (uint32_t)block, DLLM__RNG_DPAD),
                         block_end + d});
    std::vector<int32_t> keep;
    if (p.dpad == DLLM_DPAD_GAUSSIAN) {
        for (int d = 0; d < window; d++) {
            double x = (double)p.dpad_k * d / (p.dpad_window - 1);
            if (draws[(size_t)d].first < (double)p.dpad_scale * exp(-0.5 * x * x) / sqrt(2 * M_PI))
                keep.push_back(draws[(size_t)d].second);
        }
    } else {
        std::sort(draws.begin(), draws.end());
        for (int i = 0; i < std::min(p.dpad_n, window); i++) keep.push_back(draws[(size_t)i].second);
        std::sort(keep.begin(), keep.end());
    }
    return keep;
}

/* Under DPad a block runs on a compacted canvas: the whole canvas up to the block end, then the kept
 * suffix masks, each row with its original RoPE position. */
static void dllm__dpad_view(const std::vector<int32_t> &full, int block_end, const std::vector<int32_t> &keep,
                            int32_t mask_id, dllm__decode &st) {
    st.canvas.assign(full.begin(), full.begin() + block_end);
    st.canvas.resize((size_t)block_end + keep.size(), mask_id);
    st.positions.resize(st.canvas.size());
    for (int i = 0; i < block_end; i++) st.positions[(size_t)i] = i;
    for (size_t i = 0; i < keep.size(); i++) st.positions[(size_t)block_end + i] = keep[i];
    st.is_prompt.resize(st.canvas.size(), 0);
}

/* Copies the generated part to out; with stop_at_eos it ends before the first EOS/EoT. */
static int dllm__emit_output(const std::vector<int32_t> &canvas, int n_prompt, const dllm__gen_plan &plan,
                             bool stop_at_eos, int32_t *out) {
    int n = 0;
    for (size_t p = (size_t)n_prompt; p < canvas.size(); p++) {
        int32_t t = canvas[p];
        if (stop_at_eos && (t == plan.eos_id || t == plan.eot_id) && t >= 0) break;
        out[n++] = t;
    }
    return n;
}

/* The last step a generation showed, kept for dllm_stepper_poll: its dllm_step_info with the canvas and the committed
 * positions copied, since the generation changes both at its next step. */
struct dllm__step_watch {
    dllm_step_info info = {};
    std::vector<int32_t> canvas, committed;
    bool stepped = false;  // a forward of the generation ran in the stepper's last step

    void record(const dllm_step_info &step) {
        canvas.assign(step.canvas, step.canvas + step.canvas_len);
        committed.assign(step.committed_pos, step.committed_pos + step.n_committed);
        info = step;
        info.canvas = canvas.data(), info.committed_pos = committed.data();
        stepped = true;
    }
};

/* Shows a generation's step to a stepper's watch (when it has one) and to the caller's step callback (when given),
 * whose non-zero return cancels the generation: the one report of dllm_generate's loops (plain, LLaDA2, block
 * diffusion). */
static dllm_status dllm__report_step(const dllm_gen_params &p, dllm__step_watch *watch, const dllm_step_info &info) {
    if (watch) watch->record(info);
    if (p.on_step && p.on_step(&info, p.on_step_data) != 0)
        return dllm__fail(DLLM_ERR_CANCELLED, "generation cancelled by the step callback after step %d",
                          info.global_step);
    return DLLM_OK;
}

/* The decoding loop of one generation: blocks left to right, steps until the schedule or the rule says the
 * block is done. The full canvas lives here; under DPad the backend sees one compacted view per block. */
struct dllm__generation {
    dllm_ctx &ctx;
    const dllm_gen_params &p;
    const dllm__gen_plan &plan;
    dllm__decode st;
    std::vector<int32_t>
        full;  // prompt ++ generation (current after each block, or each step with a callback or watch)
    int steps_done = 0;

    int block = 0, step_in_loop = 0;    // the block being decoded and the steps it has run
    bool done = false;                  // every block decoded (or early_stop)
    dllm__step_watch *watch = nullptr;  // a stepper's sequence: every step is recorded there

    /* dllm_step_info.total_steps: the schedule's count, else one step a mask at most (the prompt's masks decode
     * too). */
    int total_steps() const {
        if (plan.steps_per_block) return plan.n_blocks * plan.steps_per_block;
        int prompt_masks = 0;
        for (int i = 0; i < st.n_prompt; i++) prompt_masks += st.is_prompt[(size_t)i] == 0;
        return p.gen_length + prompt_masks;
    }

    /* Threshold/factor commit at least one candidate per step, so a block ends within its masks' count of steps
     * (plus the prompt's masks); the bound only guards against a bug. */
    int max_steps() const { return plan.steps_per_block ? plan.steps_per_block : st.block_end + 1; }

    /* The decoding loop, one step at a time: dllm_generate's, while a stepper (dllm__batch_step) steps several
     * generations through start / end_step / finish with one batched forward per step. */
    dllm_status run() {
        dllm_status s = start();
        std::vector<int32_t> committed;
        while (s == DLLM_OK && !done) {
            s = ctx.impl->step(st, committed, p.on_step != nullptr);
            if (s == DLLM_OK) s = end_step(committed);
        }
        return finish(s);
    }

    dllm_status start() {
        full = st.canvas;
        if (p.dpad == DLLM_DPAD_OFF) DLLM__TRY(ctx.impl->begin(st));
        return open_block(0);
    }

    dllm_status open_block(int b) {
        const int begin = st.n_prompt + b * p.block_length, end = begin + p.block_length;
        block = b, step_in_loop = 0;
        if (p.dpad != DLLM_DPAD_OFF) {
            dllm__dpad_view(full, end, dllm__dpad_keep(p, end, (int)full.size(), b), plan.mask_id, st);
            DLLM__TRY(ctx.impl->begin(st));
        }
        st.block_begin = begin, st.block_end = end, st.step_in_block = 0;
        return ctx.impl->begin_block(st);
    }

    /* After a step: the counters, the callback, and the next block once this one is done. */
    dllm_status end_step(const std::vector<int32_t> &committed) {
        st.step_in_block++;
        st.global_step++;
        steps_done++;
        if (p.on_step || watch) DLLM__TRY(report(block, step_in_loop, committed));
        const int limit = max_steps();
        step_in_loop++;
        if (plan.steps_per_block ? step_in_loop < limit : st.n_block_left > 0) {
            if (!plan.steps_per_block && step_in_loop == limit)
                return dllm__fail(DLLM_ERR_INTERNAL, "block %d still has masks after %d steps", block, limit);
            return DLLM_OK;
        }
        // The next DPad view is cut from the full canvas, so the block's tokens must be in it.
        if (p.dpad != DLLM_DPAD_OFF) DLLM__TRY(sync_canvas());
        done = block + 1 == plan.n_blocks || (p.early_stop && stop_early(block));
        return done ? DLLM_OK : open_block(block + 1);
    }

    /* The generation ends (s: how): the canvas comes to the host, also after a cancellation. */
    dllm_status finish(dllm_status s) {
        done = true;
        if (s == DLLM_OK || s == DLLM_ERR_CANCELLED) {
            dllm_status fin = sync_canvas();
            if (s == DLLM_OK) s = fin;
        }
        return s;
    }

    /* Brings the backend's canvas to the host and into the full canvas. */
    dllm_status sync_canvas() {
        DLLM__TRY(ctx.impl->finish(st));
        std::copy(st.canvas.begin(), st.canvas.begin() + std::min(st.canvas.size(), (size_t)st.block_end),
                  full.begin());
        return DLLM_OK;
    }

    /* Early termination (DPad): once a finished block holds EOS/EoT, the rest becomes that token. */
    bool stop_early(int b) {
        if (sync_canvas() != DLLM_OK) return false;
        const int begin = st.n_prompt + b * p.block_length, end = begin + p.block_length;
        for (int q = begin; q < end; q++) {
            int32_t t = full[(size_t)q];
            if (t >= 0 && (t == plan.eos_id || t == plan.eot_id)) {
                std::fill(full.begin() + end, full.end(), plan.eos_id >= 0 ? plan.eos_id : plan.eot_id);
                return true;
            }
        }
        return false;
    }

    dllm_status report(int b, int i, const std::vector<int32_t> &committed) {
        std::copy(st.canvas.begin(), st.canvas.begin() + st.block_end, full.begin());
        int masks = 0;
        for (size_t q = (size_t)st.n_prompt; q < full.size(); q++) masks += full[q] == plan.mask_id;
        dllm_step_info info = {b,
                               plan.n_blocks,
                               i,
                               plan.steps_per_block,
                               steps_done,
                               total_steps(),
                               (int)committed.size(),
                               committed.data(),
                               full.data(),
                               (int)full.size(),
                               st.n_prompt,
                               masks};
        return dllm__report_step(p, watch, info);
    }
};
