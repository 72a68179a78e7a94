/* src/cpu/token_choice.cpp - token choice: argmax / Gumbel-max, confidences, unmasking rules. */

// ---------------------------------------------------------------------------------------------------
// 10. Token choice: argmax / Gumbel-max, confidences (LLaDA's, Dream's), unmasking rules
//    These are the CPU twins of the GPU sampler kernels. Ties go to the lower vocabulary index and to
//    the lower canvas position, so the result never depends on evaluation order.
// ---------------------------------------------------------------------------------------------------

struct dllm__sampling {
    double temperature = 0;
    dllm_remasking remasking = DLLM_REMASK_LOW_CONFIDENCE;
    bool tempered_conf = false;  // the confidence's softmax is Dream's softmax(l / T), not LLaDA's softmax(l)
    double alg_temp = 0;         // > 0: rank by conf / alg_temp + Gumbel noise (Dream's alg_temp)
    uint64_t seed = 0;
    bool eos_logit_inf = false;  // logits_eos_inf
    bool defer_eos_eot = false;  // confidence_eos_eot_inf
    int32_t eos_id = -1, eot_id = -1;
    int top_k = 0;  // the filters of dllm_gen_params (dllm.h): 0, 1, 0 = off
    double top_p = 1, min_p = 0;
    bool filters() const { return top_k > 0 || (top_p > 0 && top_p < 1) || min_p > 0; }
};

struct dllm__choice {
    int32_t token;
    double conf;    // the ranking key: the confidence, or with alg_temp its Gumbel-perturbed conf / alg_temp
    bool deferred;  // predicts EOS/EoT under confidence_eos_eot_inf: ranked after every other candidate
};

/* The ranking key of a row from its softmax statistics: z = sum e^x and zx = sum e^x x over the vocabulary,
 * x = (l - max logit) * inv_t, and the x of x0 and of the second largest logit. Twin: row_confidence. */
static double dllm__confidence(const dllm__sampling &s, double z, double zx, double x_best, double x_second,
                               uint32_t pos, uint32_t step) {
    double c;
    switch (s.remasking) {
        case DLLM_REMASK_RANDOM: c = dllm__uniform(s.seed, 0, pos, step, DLLM__RNG_REMASK); break;
        case DLLM_REMASK_ORIGIN: c = -dllm__uniform(s.seed, 0, pos, step, DLLM__RNG_ORIGIN); break;
        case DLLM_REMASK_MARGIN: c = -expm1(x_second) / z; break;  // (e^0 - e^x_second) / z: top1 - top2
        case DLLM_REMASK_ENTROPY: c = zx / z - log(z); break;      // sum q log q with log q = x - log z
        default: c = exp(x_best) / z;
    }
    if (c != c) c = -INFINITY;  // NaN logits never win a slot
    // Gumbel-top-k: the k largest conf / alg_temp + G are a sample without replacement from softmax(conf / alg_temp).
    if (s.alg_temp > 0) c = c / s.alg_temp - log(-log(dllm__uniform(s.seed, 0, pos, step, DLLM__RNG_ALG_TEMP)));
    return c;
}

/* The sampler filters as one cutoff logit: a token is kept iff its logit is >= the cutoff (-inf keeps every
 * non-NaN logit), the largest of the three cutoffs below, each a logit of the row. With x = (l - max) * inv_t,
 * inv_t = 1/T at T > 0 else 1, and p = e^x / Z: top-k's is the k-th largest logit; top-p's the largest
 * logit t whose mass sum_{l >= t} e^x reaches top_p * Z; min-p's the smallest logit with e^x >= min_p.
 * NaN logits count nowhere. Twin: row_cutoff_kernel, which finds the same logits by bisection (the top-p
 * mass is summed in another order there: a cut within float64 rounding of top_p * Z may differ). */
static float dllm__row_cutoff(const std::vector<float> &row, const dllm__sampling &s) {
    std::vector<float> v;
    v.reserve(row.size());
    for (float l : row)
        if (l == l) v.push_back(l);
    float cut = -INFINITY;
    if (v.empty()) return cut;
    std::sort(v.begin(), v.end(), std::greater<float>());
    if (s.top_k > 0 && (size_t)s.top_k <= v.size()) cut = std::max(cut, v[(size_t)s.top_k - 1]);
    if (v[0] == -INFINITY) return cut;
    const double inv_t = s.temperature > 0 ? 1.0 / s.temperature : 1.0, mx = v[0];
    auto weight = [&](float l) { return exp(((double)l - mx) * inv_t); };
    if (s.top_p > 0 && s.top_p < 1) {
        double z = 0, mass = 0;
        for (float l : v) z += weight(l);
        for (size_t i = 0; i < v.size(); i++) {
            mass += weight(v[i]);
            if ((i + 1 == v.size() || v[i + 1] != v[i]) && mass >= s.top_p * z) {
                cut = std::max(cut, v[i]);
                break;
            }  // ties: the whole group
        }
    }
    if (s.min_p > 0) {
        float smallest = v[0];
        for (float l : v)
            if (weight(l) >= s.min_p) smallest = l;
        cut = std::max(cut, smallest);
    }
    return cut;
}

/* The Gumbel-max key of a logit l at temperature T > 0 with its uniform draw u: l / T - log(-log u), in float64.
 * generate.py's key exp(l) / (-log u)^T is the exponential of T times this one (the same order), but leaves a
 * double's range for T above about 19 (-log u spans [2^-54, 37.4]), where most keys are +inf or 0 and the lowest id
 * wins. This one draws from softmax(l / T) at any finite T; the chosen token differs from generate.py's only where
 * the two best keys are within float64 rounding of each other. Twin: gumbel_key. */
static double dllm__gumbel_key(float l, double T, double u) { return (double)l / T - log(-log(u)); }

/* x0 and its ranking key for one canvas position from its logits row (generate.py and Dream semantics):
 * x0 = argmax(l) at T = 0, else the argmax of dllm__gumbel_key (Gumbel-max of softmax(l/T)).
 * The confidence is taken in float64 under q = softmax(l * inv_t), inv_t = 1/T where Dream tempers it, else 1:
 * q(x0) (LOW_CONFIDENCE), q(top1) - q(top2) (MARGIN), sum q log q (ENTROPY), u (RANDOM), or -u (ORIGIN: ranked
 * by ascending draw, the draws below the transfer probability are a prefix of the ranking). */
static dllm__choice dllm__choose(const float *logits, int n_vocab, const dllm__sampling &s, uint32_t pos,
                                 uint32_t step) {
    auto raw_logit = [&](int v) { return s.eos_logit_inf && v == s.eos_id ? -INFINITY : logits[v]; };
    float cutoff = -INFINITY;
    const bool filtered = s.filters();
    if (filtered) {
        std::vector<float> row((size_t)n_vocab);
        for (int v = 0; v < n_vocab; v++) row[(size_t)v] = raw_logit(v);
        cutoff = dllm__row_cutoff(row, s);
    }
    // A filtered token (NaN included) is -inf to everything below; with no filter the row is untouched.
    auto logit = [&](int v) {
        float l = raw_logit(v);
        return filtered && !(l >= cutoff) ? -INFINITY : l;
    };
    int best = 0;
    double best_score = -INFINITY;
    float max_logit = -INFINITY, second_logit = -INFINITY;  // a tie for the largest counts twice
    for (int v = 0; v < n_vocab; v++) {
        float l = logit(v);
        second_logit = std::max(second_logit, l > max_logit ? max_logit : l);  // a NaN never enters, as on the GPU
        if (l > max_logit) max_logit = l;
        double score = l;
        if (s.temperature > 0)
            score = dllm__gumbel_key(l, s.temperature, dllm__uniform(s.seed, (uint32_t)v, pos, step, DLLM__RNG_GUMBEL));
        if (score > best_score) {
            best_score = score;
            best = v;
        }
    }
    const double inv_t = s.tempered_conf && s.temperature > 0 ? 1.0 / s.temperature : 1.0;
    double z = 0, zx = 0;
    for (int v = 0; v < n_vocab; v++) {
        double x = ((double)logit(v) - max_logit) * inv_t, e = exp(x);
        z += e;
        if (e > 0) zx += e * x;  // e = 0 at x = -inf: the term is 0, not NaN
    }
    dllm__choice ch;
    ch.token = best;
    ch.conf = dllm__confidence(s, z, zx, ((double)logit(best) - max_logit) * inv_t,
                               ((double)second_logit - max_logit) * inv_t, pos, step);
    ch.deferred = s.defer_eos_eot && (best == s.eos_id || best == s.eot_id);
    return ch;
}

/* How many candidates a step commits (decoding.md 1, 2, 4). Twin: select_commit on the device. */
struct dllm__unmask_rule {
    dllm_unmask kind = DLLM_UNMASK_SCHEDULE;
    double threshold = 0.9, factor = 1.0, eps = 1e-3;
    bool origin = false;  // DLLM_REMASK_ORIGIN (TIMESTEPS only): each candidate transfers with the step's probability
};

/* Dream's timesteps t = linspace(1, eps, s + 1): step i moves the fraction 1 - t[i+1]/t[i] of the masks left,
 * all of them at the last step. In float64 (Dream: float32, so a count can differ where n times this fraction
 * is within float32 rounding of an integer). Twin: timestep_fraction; no product feeds a sum here, so the GPU
 * cannot fuse an FMA that would round differently. */
static double dllm__timestep_fraction(int i, int s, double eps) {
    if (i >= s - 1) return 1.0;
    double t = 1.0 - (1.0 - eps) * i / s, u = 1.0 - (1.0 - eps) * (i + 1) / s;
    return 1.0 - u / t;
}

/* Dream's count for n candidates left at step i of s: floor(n (1 - t[i+1]/t[i])), possibly 0; n at the last step. */
static int dllm__timestep_count(int n, int s, int i, double eps) {
    return (int)floor(n * dllm__timestep_fraction(i, s, eps));
}

/* Does the candidate of 0-based rank r (best first) pass? A step commits the ranks before the first that
 * fails. Threshold: Fast-dLLM's `conf >= tau` with the best always in. Factor: the n-th best (n = r + 1)
 * needs c_n >= 1 - f / (n + 1); the first always passes. Fast-dLLM's factor code commits one more when the
 * last candidate fails (an off-by-one); dllm stops at the first failure, the rule as published. A deferred
 * candidate (EOS/EoT under confidence_eos_eot_inf) only ever enters as the best. Origin: the draw u = -conf
 * is below the transfer probability. The counted rules: the first k. */
static bool dllm__passes(const dllm__unmask_rule &u, int r, const dllm__choice &c, int k, double p_transfer) {
    switch (u.kind) {
        case DLLM_UNMASK_THRESHOLD: return r == 0 || (!c.deferred && c.conf >= u.threshold);
        case DLLM_UNMASK_FACTOR: return r == 0 || (!c.deferred && c.conf >= 1.0 - u.factor / (r + 2));
        default: return u.origin ? -c.conf < p_transfer : r < k;
    }
}

/* The candidates a step commits, as indices into cand in ascending position order. Rank: non-deferred
 * before deferred, then higher confidence, then lower position; k is a counted rule's count, p_transfer
 * ORIGIN's probability. */
static std::vector<int> dllm__select(const std::vector<int32_t> &cand_pos, const std::vector<dllm__choice> &ch,
                                     const dllm__unmask_rule &u, int k, double p_transfer = 0) {
    std::vector<int> order(cand_pos.size());
    for (size_t i = 0; i < order.size(); i++) order[i] = (int)i;
    auto better = [&](int a, int b) {
        if (ch[(size_t)a].deferred != ch[(size_t)b].deferred) return !ch[(size_t)a].deferred;
        if (ch[(size_t)a].conf != ch[(size_t)b].conf) return ch[(size_t)a].conf > ch[(size_t)b].conf;
        return cand_pos[(size_t)a] < cand_pos[(size_t)b];
    };
    std::sort(order.begin(), order.end(), better);
    size_t n = 0;
    while (n < order.size() && dllm__passes(u, (int)n, ch[(size_t)order[n]], k, p_transfer)) n++;
    order.resize(n);
    std::sort(order.begin(), order.end());
    return order;
}
