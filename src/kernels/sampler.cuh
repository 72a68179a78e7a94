__device__ __forceinline__ int logits_row(const sampler_args &a, int row) {
    return (a.shift0 ? max(row - 1, 0) : row) + a.lrow0;
}

/* Twin: the CPU's CFG combination and logits_eos_inf. lr is a logits row (see logits_row). */
__device__ __forceinline__ float sampler_logit(const sampler_args &a, int lr, int v) {
    if (a.eos_inf && v == a.eos_id) return -DLLM_INF;
    float c = a.cond[(u64)lr * a.vocab + v];
    if (!a.uncond) return c;
    float u = a.uncond[(u64)lr * a.vocab + v];
    // Rounded op by op, never fused into an FMA: the CPU's combination (apply_cfg) rounds each step, and the filters'
    // cutoffs (row_cutoff_kernel) compare these values exactly.
    return __fadd_rn(u, __fmul_rn(a.cfg_weight, __fsub_rn(c, u)));
}

/* sampler_logit after the filters of sampler row `row`. Twin: the logit lambda of dllm__choose. */
__device__ __forceinline__ float kept_logit(const sampler_args &a, int row, int lr, int v) {
    float l = sampler_logit(a, lr, v);
    return a.cutoff && !(l >= a.cutoff[row]) ? -DLLM_INF : l;
}

/* l / T - log(-log u): the Gumbel-max key in log space, finite at any temperature. Twin: dllm__gumbel_key. */
__device__ __forceinline__ double gumbel_key(float l, double T, double u) { return (double)l / T - log(-log(u)); }

__device__ __forceinline__ bool better(double s, int i, double bs, int bi) { return s > bs || (s == bs && i < bi); }

__device__ __forceinline__ double conf_inv_temp(const sampler_args &a) {
    return a.conf_tempered && a.temperature > 0 ? 1.0 / a.temperature : 1.0;
}

/* (m1, m2) := the two largest of the multiset {m1, m2, o1, o2}, given m1 >= m2 and o1 >= o2. */
__device__ __forceinline__ void top2_merge(float &m1, float &m2, float o1, float o2) {
    m2 = fmaxf(fminf(m1, o1), fmaxf(m2, o2));
    m1 = fmaxf(m1, o1);
}

/* Pass 1 for one (slice, row): max logit, best token, sum of e^x relative to the slice max; TOP2 adds the second
 * largest logit (MARGIN), ENT the sum of e^x x (ENTROPY). Compile-time, so the default path runs its old loop. */
template <bool TOP2, bool ENT>
__device__ __forceinline__ void conf_partial_slice(const sampler_args &a, const dllm_step_state *st,
                                                   conf_partial *out) {
    int slice = blockIdx.x, row = blockIdx.y, lr = logits_row(a, row);
    int v0 = slice * a.slice, v1 = min(a.vocab, v0 + a.slice);
    u32 step = (u32)st->global_step, pos = (u32)(a.pos0 + row);
    float mx = -DLLM_INF, second = -DLLM_INF;
    double best = -1.0 / 0.0;
    int best_i = 0x7fffffff;
    for (int v = v0 + threadIdx.x; v < v1; v += blockDim.x) {
        float l = kept_logit(a, row, lr, v);
        if (TOP2) second = fmaxf(second, l > mx ? mx : l);  // the CPU's update: a NaN never enters
        mx = fmaxf(mx, l);
        double score = l;
        if (a.temperature > 0) score = gumbel_key(l, a.temperature, uniform01(a.seed, (u32)v, pos, step, 1u));
        if (better(score, v, best, best_i)) {
            best = score;
            best_i = v;
        }
    }
    __shared__ float s_mx[32], s_second[32];
    __shared__ double s_best[32];
    __shared__ int s_bi[32];
    __shared__ double s_sum[32], s_sum_x[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1) {
        float omx = __shfl_xor_sync(0xffffffffu, mx, o);
        if (TOP2)
            top2_merge(mx, second, omx, __shfl_xor_sync(0xffffffffu, second, o));
        else
            mx = fmaxf(mx, omx);
        double ob = __shfl_xor_sync(0xffffffffu, best, o);
        int oi = __shfl_xor_sync(0xffffffffu, best_i, o);
        if (better(ob, oi, best, best_i)) {
            best = ob;
            best_i = oi;
        }
    }
    if (lane == 0) {
        s_mx[warp] = mx;
        s_second[warp] = second;
        s_best[warp] = best;
        s_bi[warp] = best_i;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < nw; w++) {
            if (TOP2)
                top2_merge(mx, second, s_mx[w], s_second[w]);
            else
                mx = fmaxf(mx, s_mx[w]);
            if (better(s_best[w], s_bi[w], best, best_i)) {
                best = s_best[w];
                best_i = s_bi[w];
            }
        }
        s_mx[0] = mx;
        s_bi[0] = best_i;
        s_best[0] = best;
    }
    __syncthreads();
    mx = s_mx[0];
    const double inv_t = conf_inv_temp(a);
    double sum = 0, sum_x = 0;
    if (mx > -DLLM_INF)
        for (int v = v0 + threadIdx.x; v < v1; v += blockDim.x) {
            double x = ((double)kept_logit(a, row, lr, v) - (double)mx) * inv_t, e = exp(x);
            sum += e;
            if (ENT) sum_x += e > 0 ? e * x : 0.0;  // e = 0 at x = -inf: the term is 0, not NaN
        }
    for (int o = 16; o > 0; o >>= 1) {
        sum += __shfl_xor_sync(0xffffffffu, sum, o);
        if (ENT) sum_x += __shfl_xor_sync(0xffffffffu, sum_x, o);
    }
    if (lane == 0) {
        s_sum[warp] = sum;
        s_sum_x[warp] = sum_x;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < nw; w++) {
            sum += s_sum[w];
            if (ENT) sum_x += s_sum_x[w];
        }
        conf_partial p;
        p.best_score = s_best[0];
        p.best_idx = s_bi[0];
        p.best_logit = s_bi[0] < a.vocab ? kept_logit(a, row, lr, s_bi[0]) : -DLLM_INF;
        p.max_logit = mx;
        p.second_logit = second;  // thread 0 merged every warp's pair above
        p.sum_exp = sum;
        p.sum_exp_x = sum_x;
        out[(u64)row * a.n_slices + slice] = p;
    }
}

/* Pass 1: one CTA per (slice, row); the confidence decides, once per CTA, which statistics the slice needs. */
KERNEL_conf_partial_kernel {
    pdl_enter();
    if (a.remasking == REMASK_MARGIN)
        conf_partial_slice<true, false>(a, st, out);
    else if (a.remasking == REMASK_ENTROPY)
        conf_partial_slice<false, true>(a, st, out);
    else
        conf_partial_slice<false, false>(a, st, out);
}

/* Block-wide reductions for row_cutoff_kernel: every thread gets the same value, summed in the same order,
 * so the bisection below takes the same branch in every thread (and on every run). */
__device__ double cut_block_sum(double v) {
    __shared__ double s_part[32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();  // the previous call's readers are done with s_part
    if ((threadIdx.x & 31) == 0) s_part[threadIdx.x >> 5] = v;
    __syncthreads();
    double t = 0;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) t += s_part[w];
    return t;
}
__device__ float cut_block_max(float v) {
    __shared__ float s_part[32];
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if ((threadIdx.x & 31) == 0) s_part[threadIdx.x >> 5] = v;
    __syncthreads();
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) v = fmaxf(v, s_part[w]);
    return v;
}

/* Floats in the order of unsigned integers (-inf lowest, +inf highest), and back. */
__device__ __forceinline__ unsigned cut_key(float f) {
    unsigned u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float cut_key_float(unsigned k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

/* Over the row's non-NaN logits l >= the float of key k: their count (mass = false) or sum of e^x
 * (mass = true), x = (l - mx) inv_t. */
__device__ double cut_measure(const sampler_args &a, int lr, unsigned k, bool mass, float mx, double inv_t) {
    double acc = 0;
    for (int v = threadIdx.x; v < a.vocab; v += blockDim.x) {
        float l = sampler_logit(a, lr, v);
        if (l == l && cut_key(l) >= k) acc += mass ? exp(((double)l - (double)mx) * inv_t) : 1.0;
    }
    return cut_block_sum(acc);
}

/* The largest key k whose measure is >= target (32 halvings of the key range): the key of a logit of the
 * row, since the measure only changes at those. Needs measure(0) >= target. */
__device__ unsigned cut_bisect(const sampler_args &a, int lr, bool mass, double target, float mx, double inv_t) {
    unsigned long long lo = 0, hi = 1ull << 32;  // measure(lo) >= target; hi is past every key
    while (hi - lo > 1) {
        unsigned long long mid = (lo + hi) / 2;
        if (cut_measure(a, lr, (unsigned)mid, mass, mx, inv_t) >= target)
            lo = mid;
        else
            hi = mid;
    }
    return (unsigned)lo;
}

/* The filters' cutoff logit of each sampler row (one CTA per row): a logit is kept iff it is >= the cutoff.
 * The largest of top-k's k-th largest logit, top-p's largest logit whose mass of logits >= it reaches
 * top_p * Z, min-p's smallest logit with e^x >= min_p. Twin: dllm__row_cutoff. */
KERNEL_row_cutoff_kernel {
    pdl_enter();
    const int row = blockIdx.x, lr = logits_row(a, row);
    float mx = -DLLM_INF;
    for (int v = threadIdx.x; v < a.vocab; v += blockDim.x) mx = fmaxf(mx, sampler_logit(a, lr, v));  // fmaxf drops NaN
    mx = cut_block_max(mx);
    float cut = -DLLM_INF;
    const double inv_t = a.temperature > 0 ? 1.0 / a.temperature : 1.0;
    if (a.top_k > 0 && cut_measure(a, lr, 0u, false, mx, inv_t) >= a.top_k)
        cut = fmaxf(cut, cut_key_float(cut_bisect(a, lr, false, a.top_k, mx, inv_t)));
    if (mx > -DLLM_INF && a.top_p > 0 && a.top_p < 1) {
        double z = cut_measure(a, lr, 0u, true, mx, inv_t);
        cut = fmaxf(cut, cut_key_float(cut_bisect(a, lr, true, (double)a.top_p * z, mx, inv_t)));
    }
    if (mx > -DLLM_INF && a.min_p > 0) {
        float smallest = mx;
        for (int v = threadIdx.x; v < a.vocab; v += blockDim.x) {
            float l = sampler_logit(a, lr, v);
            if (l == l && exp(((double)l - (double)mx) * inv_t) >= (double)a.min_p) smallest = fminf(smallest, l);
        }
        cut = fmaxf(cut, -cut_block_max(-smallest));
    }
    if (threadIdx.x == 0) cutoff[row] = cut;
}

/* The ranking key from a row's softmax statistics (z, zx, and the x of x0 and of the second largest logit).
 * Twin: dllm__confidence. */
__device__ __forceinline__ double row_confidence(const sampler_args &a, double z, double zx, double x_best,
                                                 double x_second, u32 pos, u32 step) {
    double c;
    if (a.remasking == REMASK_RANDOM)
        c = uniform01(a.seed, 0u, pos, step, 2u);
    else if (a.remasking == REMASK_ORIGIN)
        c = -uniform01(a.seed, 0u, pos, step, 5u);
    else if (a.remasking == REMASK_MARGIN)
        c = -expm1(x_second) / z;
    else if (a.remasking == REMASK_ENTROPY)
        c = zx / z - log(z);
    else
        c = exp(x_best) / z;
    if (c != c) c = -1.0 / 0.0;
    if (a.alg_temp > 0) c = c / a.alg_temp - log(-log(uniform01(a.seed, 0u, pos, step, 6u)));
    return c;
}

/* Pass 2: one thread per row merges the slices in order: x0, ranking key (float64), deferral flag. A slice's sums
 * move from its max m_s to the row's m with d_s = (m_s - m) inv_t: Z = sum_s e^d_s Z_s, and for ENTROPY
 * sum e^x x = sum_s e^d_s (S_s + d_s Z_s), since x = x_s + d_s. */
KERNEL_conf_combine_kernel {
    pdl_enter();
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= a.n_rows) return;
    const conf_partial *p = parts + (u64)row * a.n_slices;
    float mx = -DLLM_INF, second = -DLLM_INF;
    double best = -1.0 / 0.0;
    int bi = 0x7fffffff;
    float bl = -DLLM_INF;
    for (int s = 0; s < a.n_slices; s++) {
        top2_merge(mx, second, p[s].max_logit, p[s].second_logit);
        if (better(p[s].best_score, p[s].best_idx, best, bi)) {
            best = p[s].best_score;
            bi = p[s].best_idx;
            bl = p[s].best_logit;
        }
    }
    const double inv_t = conf_inv_temp(a);
    double z = 0, zx = 0;
    for (int s = 0; s < a.n_slices; s++)
        if (p[s].max_logit > -DLLM_INF) {
            double d = ((double)p[s].max_logit - (double)mx) * inv_t, w = exp(d);
            z += p[s].sum_exp * w;
            zx += w * (p[s].sum_exp_x + d * p[s].sum_exp);
        }
    double c = row_confidence(a, z, zx, ((double)bl - (double)mx) * inv_t, ((double)second - (double)mx) * inv_t,
                              (u32)(a.pos0 + row), (u32)st->global_step);
    if (bi >= a.vocab) bi = 0;
    x0[row] = bi;
    conf[row] = c;
    deferred[row] = a.defer_eos_eot && (bi == a.eos_id || bi == a.eot_id);
}

/* Twin: dllm__timestep_fraction, the same operations in the same order. */
__device__ __forceinline__ double timestep_fraction(int i, int s, double eps) {
    if (i >= s - 1) return 1.0;
    double t = 1.0 - (1.0 - eps) * i / s, u = 1.0 - (1.0 - eps) * (i + 1) / s;
    return 1.0 - u / t;
}

/* Commits the step's candidates (masked positions in [cand_lo, block_end)) by rank: non-deferred first,
 * then higher key, then lower position. How many: the ranks before the first that fails the rule (rule 0
 * schedule: rank < k with k = n/s, +1 for the first n%s steps; 1 threshold; 2 factor; 3 Dream's timesteps:
 * rank < floor(candidates left * fraction); twin: dllm__passes). Rule 4, ORIGIN, needs no ranking: a candidate
 * commits when its draw (minus its key) is below the step's fraction. One CTA; each candidate's rank is counted
 * directly, which is deterministic and cheap for block-sized sets. Also counts the masks left in the block after
 * the commit (threshold decoding loops on it; twin: dllm__step_commit's dllm__count_masks). */
KERNEL_select_commit {
    pdl_enter();
    // No static shared memory: the host grants the dynamic part the whole opt-in limit.
    extern __shared__ int rank_of[];  // [n] rank of each candidate (n: not a candidate), then [n] pass flags by rank
    int lo = cand_lo, hi = st->block_end, n = hi - lo, n_cand = 0;
    unsigned char *pass = (unsigned char *)(rank_of + n);
    for (int i0 = 0; i0 < n; i0 += blockDim.x) {  // the same trip count in every thread: all reach the barrier
        int i = i0 + threadIdx.x;
        bool masked = i < n && canvas[lo + i] == mask_id;
        if (i < n) {
            rank_of[i] = masked ? 0 : n;
            pass[i] = 0;
        }
        n_cand += __syncthreads_count(masked);
    }
    __syncthreads();
    int s = st->steps_per_block, i_step = st->step_in_block, nm = st->n_block_masks;
    const double frac = timestep_fraction(i_step, s, eps);
    const bool counted = rule == 0 || rule == 3;
    int k = rule == 0 ? nm / s + (i_step < nm % s ? 1 : 0) : rule == 3 ? (int)floor(n_cand * frac) : n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        if (rank_of[i] == n) continue;
        int r = lo + i - row0;
        unsigned char di = deferred[r];
        double ci = conf[r];
        if (rule == 4) {  // every transferring candidate is rank 0 and rank 0 passes, so all of them commit
            if (-ci < frac)
                pass[0] = 1;
            else
                rank_of[i] = n;
            continue;
        }
        int rank = 0;
        // rank_of[j] is read only to tell whether j is a candidate, which another thread's write of j's rank (< n)
        // never changes: compute-sanitizer's racecheck lists these reads as potential WAR hazards (warnings), never
        // errors.
        for (int j = 0; j < n && rank < k; j++) {
            if (rank_of[j] == n || j == i) continue;
            int rj = lo + j - row0;
            unsigned char dj = deferred[rj];
            double cj = conf[rj];
            rank += dj != di ? !dj : (cj != ci ? cj > ci : j < i);
        }
        if (rank < k)
            pass[rank] =
                counted || rank == 0 || (!di && ci >= (rule == 1 ? threshold : 1.0 - factor / (rank + 2))) ? 1 : 2;
        rank_of[i] = rank;  // only this thread reads or writes slot i from here on
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int take = 0, c = 0, left = 0;
        while (take < n && pass[take] == 1) take++;
        for (int i = 0; i < n; i++) {
            int p = lo + i;
            if (rank_of[i] < take) {
                canvas[p] = x0[p - row0];
                committed[c++] = p;
            }
            // Counted after the commit, as the twin (dllm__count_masks) counts: a committed x0 that is the mask id
            // itself (a sampled draw may be) leaves its position masked, and the block goes on.
            if (p >= st->block_begin && canvas[p] == mask_id) left++;
        }
        st->n_committed = c;
        st->n_block_left = left;
        st->step_in_block++;
        st->global_step++;
    }
}
