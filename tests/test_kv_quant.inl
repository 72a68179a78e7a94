/* Tests: commit-time K/V quantisation of block diffusion (dllm_kv_quant; section 9c, spec soloq.md 7) on the CPU
 * backend: the FP16 rounding, KIVI's quantiser and SoloQ's value quantiser against their formulas on awkward random
 * inputs, the commit path (sinks exact, the active block untouched, the cache equal to the stored codes decoded),
 * logits under kv4 / kv2 against the unquantised cache on the tiny block-diffusion fixtures, bytes per token, and the
 * option's validation. kv_quant.measure prints masked-token NLL, logit NMSE and argmax agreement (DLLM_KVQ_MODEL=dir
 * adds a model). */

static dllm_ctx *test_kvq_ctx(dllm_model *m, dllm_kv_quant q, int sinks = -1,
                              dllm_precision precision = DLLM_PRECISION_AUTO) {
    dllm_ctx_params p = dllm_ctx_default_params();
    p.backend = DLLM_BACKEND_CPU;
    p.n_threads = 2;
    p.precision = precision;
    p.kv_quant = q;
    p.kv_sink_tokens = sinks;
    dllm_ctx *c = nullptr;
    if (dllm_ctx_create(m, p, &c) != DLLM_OK) fprintf(stdout, "    cannot create a context: %s\n", dllm_last_error());
    return c;
}

/* Awkward test values: Gaussian with outliers, exact ties of the grids, tiny and huge magnitudes. */
static std::vector<float> test_kvq_values(std::mt19937 &rng, size_t n, float scale) {
    std::normal_distribution<float> g(0.0f, scale);
    std::vector<float> x(n);
    for (size_t i = 0; i < n; i++) x[i] = g(rng);
    if (n > 3) x[1] *= 40.0f, x[n / 2] = 0.0f, x[n - 1] = -x[1] / 3;
    return x;
}

// ---- the quantisers ------------------------------------------------------------------------------------------

/* dllm__f32_to_f16 gives the nearest half (ties to the even code), saturates at 65504 and keeps NaN: checked against
 * the neighbours of its answer for random floats across the half range, subnormals included. */
TEST(kv_quant, f16_rounding_is_nearest_even) {
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> e(-27.0f, 17.0f), m(1.0f, 2.0f);
    int bad = 0;
    for (int i = 0; i < 200000; i++) {
        float x = ldexpf(m(rng), (int)floorf(e(rng))) * (i & 1 ? -1.0f : 1.0f);
        if (i % 1000 == 3) x = dllm__f16_to_f32((uint16_t)(rng() & 0x7bff)) + ldexpf(1.0f, -25);  // near a tie
        if (fabsf(x) >= 65504.0f) continue;
        const uint16_t h = dllm__f32_to_f16(x);
        const double v = dllm__f16_to_f32(h), err = fabs(v - x);
        const uint16_t mag = h & 0x7fff;
        for (int d = -1; d <= 1; d += 2) {
            if ((mag == 0 && d < 0) || mag + d > 0x7bff) continue;
            const double w = dllm__f16_to_f32((uint16_t)((h & 0x8000) | (mag + d)));
            const double werr = fabs(w - x);
            if (werr < err || (werr == err && (mag & 1))) bad++;
        }
    }
    CHECK_MSG(bad == 0, "%d roundings not to the nearest even half", bad);
    CHECK(dllm__f32_to_f16(1e9f) == 0x7bff && dllm__f32_to_f16(-INFINITY) == 0xfbff &&
          dllm__f32_to_f16(65504.0f) == 0x7bff);
    CHECK(dllm__f16_to_f32(dllm__f32_to_f16(NAN)) != dllm__f16_to_f32(dllm__f32_to_f16(NAN)));
    CHECK(dllm__f32_to_f16(0.0f) == 0 && dllm__f32_to_f16(-0.0f) == 0x8000 && dllm__f32_to_f16(ldexpf(1.0f, -24)) == 1);
}

/* KIVI's quantiser against spec 7.1 written out in double: the pair is (f16((max - min) / (2^b - 1)), f16(min)), each
 * code is the nearest grid step of (x - min) / scale clamped to [0, 2^b), so every value decodes within half a step
 * (plus the clamp at the ends); constant groups (max == min) store scale 0 and codes 0; NaN makes the pair NaN. */
TEST(kv_quant, kivi_quantiser_matches_its_formula) {
    std::mt19937 rng(11);
    const int sizes[] = {1, 2, 7, 32, 33, 128};
    const size_t strides[] = {1, 3, 24};
    int checked = 0;
    for (int bits : {2, 4})
        for (int n : sizes)
            for (size_t stride : strides) {
                std::vector<float> x = test_kvq_values(rng, (size_t)n * stride, 0.7f);
                std::vector<uint8_t> q((size_t)n, 0xAA);
                uint16_t pair[2] = {0xDEAD, 0xBEEF};
                dllm__kivi_quantize(x.data(), stride, n, bits, q.data(), pair);
                double mn = INFINITY, mx = -INFINITY;
                for (int i = 0; i < n; i++)
                    mn = std::min(mn, (double)x[(size_t)i * stride]), mx = std::max(mx, (double)x[(size_t)i * stride]);
                const double top = (1 << bits) - 1;
                const float scale = dllm__f16_to_f32(pair[0]), minr = dllm__f16_to_f32(pair[1]);
                CHECK(pair[1] == dllm__f32_to_f16((float)mn));
                CHECK_MSG(mx == mn ? pair[0] == 0 : pair[0] == dllm__f32_to_f16((float)((mx - mn) / top)),
                          "bits %d n %d: scale %g for range %g", bits, n, scale, mx - mn);
                for (int i = 0; i < n; i++) {
                    const double xi = x[(size_t)i * stride], t = scale > 0 ? (xi - minr) / scale : 0.0;
                    const double want = std::min(std::max(std::nearbyint(t), 0.0), top);
                    const bool near_tie = fabs(t - floor(t) - 0.5) < 1e-4;  // float and double may round a tie apart
                    const double got = dllm__kivi_decode(q[(size_t)i], pair),
                                 ref = std::min(std::max(xi, (double)minr), minr + top * scale);
                    CHECK_MSG(q[(size_t)i] == want || (near_tie && fabs(q[(size_t)i] - want) == 1),
                              "bits %d n %d i %d: code %d, want %g", bits, n, i, q[(size_t)i], want);
                    CHECK_MSG(fabs(got - ref) <= 0.5001 * scale + 1e-6 * fabs(xi),
                              "bits %d n %d i %d: %g decodes to %g", bits, n, i, xi, got);
                    checked++;
                }
            }
    printf("    %d values checked\n", checked);
    // max == min: scale 0, codes 0, every value decodes to f16(min)
    std::vector<float> c(9, 0.3125f);
    std::vector<uint8_t> q(9, 0xAA);
    uint16_t pair[2];
    dllm__kivi_quantize(c.data(), 1, 9, 4, q.data(), pair);
    CHECK(pair[0] == 0 && pair[1] == dllm__f32_to_f16(0.3125f));
    for (uint8_t v : q) CHECK(v == 0);
    CHECK(dllm__kivi_decode(0, pair) == 0.3125f);
    c[4] = NAN;
    dllm__kivi_quantize(c.data(), 1, 9, 2, q.data(), pair);
    CHECK(std::isnan(dllm__kivi_decode(q[0], pair)));
}

/* SoloQ's value quantiser: every code is the nearest Lloyd-Max level of x / RMS (4 bits: 9b's grid; 2 bits:
 * +-0.452780, +-1.510418), and the row scale restores the projection exactly, <x_hat, x> = ||x||^2 (spec 5);
 * the NMSE of K-RPBH-rotated rows with an outlier channel is near the Gaussian Lloyd-Max MSE (0.0095 / 0.117). */
TEST(kv_quant, soloq_value_quantiser_matches_its_formula) {
    std::mt19937 rng(5);
    for (int bits : {4, 2}) {
        for (int n : {16, 24, 128}) {
            const dllm__rotation r = dllm__make_rotation(DLLM__ROT_KRPBH, n, 99, 5);
            double err = 0, energy = 0;
            for (int row = 0; row < 200; row++) {
                std::vector<float> v = test_kvq_values(rng, (size_t)n, 1.0f + row % 7), x((size_t)n), xh((size_t)n);
                dllm__rotate(r, v.data(), x.data());
                std::vector<uint8_t> packed((size_t)n * bits / 8, 0);
                const float scale = dllm__kvq_soloq_row(x.data(), n, bits, packed.data());
                double ss = 0, proj = 0;
                for (int i = 0; i < n; i++) ss += (double)x[(size_t)i] * x[(size_t)i];
                const double sigma = sqrt(ss / n);
                for (int i = 0; i < n; i++) {
                    const unsigned code = dllm__kvq_get(packed.data(), i, bits);
                    static const double l4[8] = {0.128395, 0.388048, 0.656759, 0.942340,
                                                 1.256231, 1.618046, 2.069017, 2.732590},
                                        l2[2] = {0.452780, 1.510418};
                    const double *levels = bits == 4 ? l4 : l2;
                    const double z = x[(size_t)i] / sigma, c = dllm__kvq_soloq_c(code, bits);
                    double best = INFINITY;
                    for (int k = 0; k < (bits == 4 ? 8 : 2); k++) best = std::min(best, fabs(fabs(z) - levels[k]));
                    const int level = bits == 4 ? (int)(code & 7) : (int)(code & 1);
                    CHECK_MSG(fabs(fabs(z) - levels[level]) <= best + 1e-4 && (z < 0) == (c < 0),
                              "bits %d n %d: z %g coded as %g", bits, n, z, c);
                    xh[(size_t)i] = dllm__kvq_soloq_c(code, bits) * scale;
                    proj += (double)xh[(size_t)i] * x[(size_t)i];
                    err += (xh[(size_t)i] - x[(size_t)i]) * (double)(xh[(size_t)i] - x[(size_t)i]);
                }
                energy += ss;
                CHECK_MSG(fabs(proj - ss) <= 1e-4 * ss, "bits %d n %d: <x_hat, x> %g vs ||x||^2 %g", bits, n, proj, ss);
            }
            const double nmse = err / energy;
            printf("    %d-bit, head_dim %d: NMSE %.4f\n", bits, n, nmse);
            CHECK_MSG(nmse < (bits == 4 ? 0.016 : 0.16) && nmse > (bits == 4 ? 0.002 : 0.04), "bits %d n %d: NMSE %g",
                      bits, n, nmse);
        }
    }
    std::vector<float> zero(16, 0.0f);
    std::vector<uint8_t> packed(4, 0);
    CHECK(dllm__kvq_soloq_row(zero.data(), 16, 2, packed.data()) == 0.0f && packed[0] == 0);
    zero[3] = INFINITY;
    CHECK(std::isnan(dllm__kvq_soloq_row(zero.data(), 16, 2, packed.data())));
}

// ---- the commit path -----------------------------------------------------------------------------------------

/* A prefill of 2 blocks then a step of the third under each mode: rows below the sinks are bit-identical to the
 * unquantised cache's, every other committed row is what the stored codes decode to (values rotated back) and close
 * to the unquantised one, the step's rows stay full precision and out of the store, and keys decode within half a
 * KIVI step of the unquantised keys. */
TEST(kv_quant, commit_quantises_committed_rows_and_keeps_sinks) {
    dllm_model *m = test_load(test_data("tiny-fast-dllm-v2"));
    if (!m) { CHECK(m != nullptr); return; }
    const dllm__config &c = m->cfg;
    const int B = 32, V = c.n_vocab, kvd = c.n_head_kv * c.head_dim, hd = c.head_dim;
    std::vector<int32_t> ids((size_t)3 * B);
    for (size_t i = 0; i < ids.size(); i++) ids[i] = (int32_t)((i * 53 + 7) % 150);
    auto script = [&](dllm_ctx *ctx, std::vector<float> &step_logits) {
        dllm__bd_call pre;
        pre.kind = DLLM__BD_COMMIT, pre.ids = ids.data(), pre.T = 2 * B, pre.mask_block = B, pre.r0 = 2 * B - 1,
        pre.r1 = 2 * B, pre.kv_group = B;
        std::vector<float> l((size_t)V);
        CHECK_STATUS(ctx->impl->bd_begin(4 * B), DLLM_OK, nullptr);
        CHECK_STATUS(ctx->impl->bd_forward(pre, l.data()), DLLM_OK, nullptr);
        dllm__bd_call step;
        step.kind = DLLM__BD_STEP, step.ids = ids.data() + 2 * B, step.T = B, step.mask_block = B, step.r0 = 0,
        step.r1 = B;
        step_logits.assign((size_t)B * V, NAN);
        CHECK_STATUS(ctx->impl->bd_forward(step, step_logits.data()), DLLM_OK, nullptr);
    };
    dllm_ctx *ref = test_kvq_ctx(m, DLLM_KV_QUANT_NONE);
    std::vector<float> ref_logits;
    if (ref) script(ref, ref_logits);
    const dllm__bd_kv *rk = ref ? &((dllm__cpu_backend *)ref->impl.get())->bd_kv() : nullptr;
    for (int mode = DLLM_KV_QUANT_SOLOQ_KV4; mode <= DLLM_KV_QUANT_KIVI_KV2 && rk; mode++) {
        const int sinks = mode == DLLM_KV_QUANT_KIVI_KV4    ? 0
                          : mode == DLLM_KV_QUANT_SOLOQ_KV2 ? 37
                                                            : -1;  // -1: 3 for Fast-dLLM v2
        dllm_ctx *ctx = test_kvq_ctx(m, (dllm_kv_quant)mode, sinks);
        if (!ctx) { CHECK(ctx != nullptr); continue; }
        std::vector<float> logits;
        script(ctx, logits);
        const dllm__cpu_backend *cpu = (const dllm__cpu_backend *)ctx->impl.get();
        const dllm__bd_kv &kv = cpu->bd_kv();
        const dllm__kvq &q = cpu->kv_quant();
        const int n_sink = sinks < 0 ? 3 : sinks;
        CHECK(q.n_sink == n_sink && q.group == B && kv.n == 2 * B && q.bits == dllm__kvq_bits(mode));
        int sink_same = 1, decoded_same = 1, keys_close = 1, untouched = 1;
        double v_err = 0, v_energy = 0;
        std::vector<float> dec((size_t)hd), back((size_t)hd);
        for (int l = 0; l < c.n_layer; l++) {
            const size_t base = (size_t)l * kv.cap * kvd;
            for (int r = 0; r < 3 * B; r++) {
                const float *k = &kv.k[base + (size_t)r * kvd], *v = &kv.v[base + (size_t)r * kvd];
                const float *k0 = &rk->k[base + (size_t)r * kvd], *v0 = &rk->v[base + (size_t)r * kvd];
                const bool same = !memcmp(k, k0, sizeof(float) * kvd) && !memcmp(v, v0, sizeof(float) * kvd);
                if (r < n_sink) sink_same &= same;
                // the step's rows: out of the store; layer 0's (no quantised input yet) exactly as without
                if (r >= 2 * B) {
                    if (l == 0) untouched &= same;
                    for (size_t b = 0; b < q.row_bytes(); b++)
                        untouched &= q.k_codes[q.row_at(l, r) + b] == 0 && q.v_codes[q.row_at(l, r) + b] == 0;
                }
                if (r < n_sink || r >= 2 * B) continue;
                for (int e = 0; e < kvd; e++) {
                    decoded_same &= k[e] == dllm__kvq_key(q, l, r, e);
                    const float step = dllm__f16_to_f32(q.k_pairs[q.k_pair_at(l, r, e)]);
                    keys_close &= fabsf(k[e] - k0[e]) <= 0.5001f * step + 1e-3f;
                }
                for (int h = 0; h < c.n_head_kv; h++) {
                    dllm__kvq_value(q, l, r, h, dec.data());
                    if (q.soloq()) dllm__rotate_inverse(q.rot[(size_t)l], dec.data(), back.data());
                    else back = dec;
                    decoded_same &= !memcmp(back.data(), v + h * hd, sizeof(float) * hd);
                    for (int i = h * hd; i < (h + 1) * hd; i++)
                        v_err += (v[i] - v0[i]) * (double)(v[i] - v0[i]), v_energy += v0[i] * (double)v0[i];
                }
            }
        }
        const double nmse = v_err / v_energy, lerr = test_rel_err(logits.data(), ref_logits.data(), logits.size());
        printf("    %s (sinks %d): value NMSE %.4f, next block's logits max relative change %.2e\n",
               dllm__kvq_names[mode], n_sink, nmse, lerr);
        CHECK_MSG(sink_same, "%s: a sink row changed", dllm__kvq_names[mode]);
        CHECK_MSG(untouched, "%s: the step's rows were quantised", dllm__kvq_names[mode]);
        CHECK_MSG(decoded_same, "%s: the cache is not the stored codes decoded", dllm__kvq_names[mode]);
        CHECK_MSG(keys_close, "%s: a key decodes further than half a step from its value", dllm__kvq_names[mode]);
        CHECK_MSG(nmse > 0 && nmse < (q.bits == 4 ? 0.03 : 0.3), "%s: value NMSE %g", dllm__kvq_names[mode], nmse);
        CHECK_MSG(lerr > 0 && lerr < (q.bits == 4 ? 0.1 : 0.5), "%s: logits changed by %g", dllm__kvq_names[mode],
                  lerr);
        dllm_ctx_free(ctx);
    }
    dllm_ctx_free(ref);
    dllm_model_free(m);
}

/* kv_quant none (explicitly, with sinks set, which only quantisation reads) generates exactly what the default
 * context does, token for token and step for step, on both fixtures; a quantised cache still generates. */
TEST(kv_quant, none_generates_exactly_as_before) {
    for (const char *fixture : {"tiny-fast-dllm-v2", "tiny-nemotron-diffusion"}) {
        dllm_model *m = test_load(test_data(fixture));
        if (!m) { CHECK(m != nullptr); continue; }
        const int B = m->cfg.bd_size;
        std::vector<int32_t> prompt((size_t)B + 5);
        for (size_t i = 0; i < prompt.size(); i++) prompt[i] = (int32_t)((i * 31 + 3) % 90);
        dllm_gen_params gp = dllm_gen_default_params();
        gp.tuned_forwards = 1;  // dllm_generate's own forwards, which this test is about
        gp.gen_length = 3 * B, gp.block_length = B, gp.sub_block_length = B / 4, gp.stop_at_eos = 0;
        std::vector<int32_t> outs[3];
        dllm_ctx *ctxs[3] = {test_ctx(m), test_kvq_ctx(m, DLLM_KV_QUANT_NONE, 9),
                             test_kvq_ctx(m, DLLM_KV_QUANT_SOLOQ_KV2)};
        for (int k = 0; k < 3; k++) {
            if (!ctxs[k]) { CHECK(ctxs[k] != nullptr); continue; }
            outs[k].assign((size_t)4 * B + 2, -7);
            int n = 0;
            CHECK_STATUS(dllm_generate(ctxs[k], prompt.data(), (int)prompt.size(), gp, outs[k].data(),
                                       (int)outs[k].size(), &n, nullptr),
                         DLLM_OK, nullptr);
            outs[k].resize((size_t)std::max(n, 0));
            dllm_ctx_free(ctxs[k]);
        }
        CHECK_MSG(!outs[0].empty() && outs[0] == outs[1], "%s: kv_quant none changed the output", fixture);
        CHECK(!outs[2].empty());
        size_t same = 0;
        for (size_t i = 0; i < std::min(outs[0].size(), outs[2].size()); i++) same += outs[0][i] == outs[2][i];
        printf("    %s: soloq-kv2 keeps %zu of %zu generated ids\n", fixture, same, outs[0].size());
        dllm_model_free(m);
    }
}

// ---- accuracy on a model: masked-token NLL and logit NMSE ------------------------------------------------------

struct test_kvq_accuracy {
    double nll = 0, nmse = 0;  // mean masked-token NLL (nats); logit NMSE against the unquantised cache
    double agree = 0;          // masked positions whose argmax equals the unquantised cache's, as a fraction
    int tokens = 0;
};

/* For each block b >= 1 of ids (whole blocks of B): commit blocks [0, b) (one prefill forward, quantised as
 * generation quantises it), then one diffusion step of block b with every other position from 1 masked; the NLL
 * of the true tokens at the masked positions, read at the model's scoring rows. ref: the unquantised run's logits
 * (filled when empty) for the NMSE and the argmax agreement at the masked positions. */
static test_kvq_accuracy test_kvq_measure(dllm_ctx *ctx, const std::vector<int32_t> &ids, int B,
                                          std::vector<float> &ref) {
    const dllm__config &c = ctx->model->cfg;
    const int V = c.n_vocab, nb = (int)ids.size() / B;
    test_kvq_accuracy a;
    std::vector<float> logits((size_t)B * V), all;
    double err = 0, energy = 0;
    for (int b = 1; b < nb; b++) {
        std::vector<int32_t> x(ids.begin(), ids.begin() + (long)(b + 1) * B);
        for (int i = 1; i < B; i += 2) x[(size_t)b * B + i] = c.mask_id;
        dllm__bd_call pre;
        pre.kind = DLLM__BD_COMMIT, pre.ids = x.data(), pre.T = b * B, pre.mask_block = c.bd_causal_context ? 1 : B,
        pre.r0 = b * B - 1, pre.r1 = b * B;
        pre.kv_group = B;
        if (ctx->impl->bd_begin((b + 1) * B) != DLLM_OK || ctx->impl->bd_forward(pre, logits.data()) != DLLM_OK)
            return a;
        dllm__bd_call step;
        step.kind = DLLM__BD_STEP, step.ids = x.data() + (size_t)b * B, step.T = B, step.mask_block = c.bd_mask_block,
        step.r0 = 0, step.r1 = B;
        if (ctx->impl->bd_forward(step, logits.data()) != DLLM_OK) return a;
        all.insert(all.end(), logits.begin(), logits.end());
        for (int i = 1; i < B; i += 2) {
            const float *row = logits.data() + (size_t)(c.shift_logits ? i - 1 : i) * V;
            double mx = -INFINITY, sum = 0;
            for (int v = 0; v < V; v++) mx = std::max(mx, (double)row[v]);
            for (int v = 0; v < V; v++) sum += exp(row[v] - mx);
            a.nll += log(sum) + mx - row[ids[(size_t)b * B + i]];
            a.tokens++;
        }
    }
    if (ref.empty()) ref = all;
    for (size_t i = 0; i < all.size() && i < ref.size(); i++)
        err += (all[i] - ref[i]) * (double)(all[i] - ref[i]), energy += ref[i] * (double)ref[i];
    int same = 0;
    for (size_t blk = 0; all.size() == ref.size() && blk < all.size() / ((size_t)B * V); blk++)
        for (int i = 1; i < B; i += 2) {
            const size_t row = (blk * B + (size_t)(c.shift_logits ? i - 1 : i)) * V;
            same += std::max_element(all.begin() + row, all.begin() + row + V) - (all.begin() + row) ==
                    std::max_element(ref.begin() + row, ref.begin() + row + V) - (ref.begin() + row);
        }
    a.agree = (double)same / std::max(a.tokens, 1);
    a.nll /= std::max(a.tokens, 1);
    a.nmse = energy > 0 ? err / energy : 0;
    return a;
}

/* Every mode on one model (weights in `precision`): prints the table, returns the results by mode. */
static std::vector<test_kvq_accuracy> test_kvq_table(dllm_test_state &T_, dllm_model *m, const char *name,
                                                     const std::vector<int32_t> &ids, int B,
                                                     dllm_precision precision = DLLM_PRECISION_AUTO) {
    std::vector<test_kvq_accuracy> r;
    std::vector<float> ref;
    for (int mode = DLLM_KV_QUANT_NONE; mode <= DLLM_KV_QUANT_KIVI_KV2; mode++) {
        dllm_ctx *ctx = test_kvq_ctx(m, (dllm_kv_quant)mode, -1, precision);
        CHECK(ctx != nullptr);
        r.push_back(ctx ? test_kvq_measure(ctx, ids, B, ref) : test_kvq_accuracy());
        dllm_ctx_free(ctx);
        double bytes = 0;
        dllm_kv_bytes_per_token(m, (dllm_kv_quant)mode, B, &bytes);
        printf("    %s %-9s: masked-token NLL %.5f (%+.3f%%), logit NMSE %.3e, argmax agreement %.4f over %d tokens; "
               "%.1f bytes/token (%.3fx)\n",
               name, dllm__kvq_names[mode], r.back().nll, 100 * (r.back().nll / r[0].nll - 1), r.back().nmse,
               r.back().agree, r.back().tokens, bytes,
               bytes / dllm__kvq_bytes_per_token(m->cfg, DLLM_KV_QUANT_NONE, B));
    }
    return r;
}

/* The tiny random fixtures (and the model in DLLM_KVQ_MODEL, with ids from DLLM_KVQ_IDS, or the text file
 * DLLM_KVQ_TEXT through the model's tokenizer as one string, or drawn; the first DLLM_KVQ_LENGTH of them, default as
 * many as the model's positions hold, in whole blocks; weights in DLLM_KVQ_PRECISION, e.g. soloq-n for W4A4KV4 / KV2;
 * the NMSE and agreement are against the same weights' unquantised cache): kv4 changes logits by a small measured
 * amount, kv2 by more. */
TEST(kv_quant, measure) {
    struct fixture { const char *dir; int B; } fixtures[] = {{"tiny-fast-dllm-v2", 32}, {"tiny-nemotron-diffusion", 8}};
    for (const fixture &f : fixtures) {
        dllm_model *m = test_load(test_data(f.dir));
        if (!m) { CHECK(m != nullptr); continue; }
        std::vector<int32_t> ids((size_t)6 * f.B);
        for (size_t i = 0; i < ids.size(); i++) ids[i] = (int32_t)((i * 97 + 13) % (size_t)(m->cfg.n_vocab - 40));
        std::vector<test_kvq_accuracy> r = test_kvq_table(T_, m, f.dir, ids, f.B);
        if (r.size() == 5) {
            CHECK(r[0].nmse == 0 && r[0].tokens > 0 && r[0].agree == 1);
            CHECK_MSG(r[1].nmse > 0 && r[1].nmse < 1e-2 && fabs(r[1].nll / r[0].nll - 1) < 0.02,
                      "%s soloq-kv4: NMSE %g", f.dir, r[1].nmse);
            CHECK_MSG(r[2].nmse > r[1].nmse && r[4].nmse > r[3].nmse, "%s: 2 bits not worse than 4", f.dir);
        }
        dllm_model_free(m);
    }
    const char *dir = getenv("DLLM_KVQ_MODEL");
    if (!dir || !*dir) return;
    dllm_model *m = test_load(dir);
    if (!m) { CHECK(m != nullptr); return; }
    const int B = m->cfg.bd_size;
    std::vector<int32_t> ids;
    const char *ids_file = getenv("DLLM_KVQ_IDS"), *text_file = getenv("DLLM_KVQ_TEXT"),
               *length = getenv("DLLM_KVQ_LENGTH");
    if (text_file && *text_file && (!ids_file || !*ids_file)) {
        const std::string text = test_read_file(text_file);
        dllm_tokenizer *tok = nullptr;
        CHECK_STATUS(dllm_tokenizer_load(dir, &tok), DLLM_OK, nullptr);
        int n = 0;
        if (tok && !text.empty()) dllm_tokenize(tok, text.data(), text.size(), 0, nullptr, 0, &n);
        ids.resize((size_t)n);
        if (n) CHECK_STATUS(dllm_tokenize(tok, text.data(), text.size(), 0, ids.data(), n, &n), DLLM_OK, nullptr);
        dllm_tokenizer_free(tok);
        CHECK_MSG(!ids.empty(), "DLLM_KVQ_TEXT=%s gave no ids", text_file);
    } else if (ids_file && *ids_file) {
        std::string text = test_read_file(ids_file);
        for (const char *p = text.c_str(); *p;) {
            char *end;
            long v = strtol(p, &end, 10);
            if (end == p) { p++; continue; }
            ids.push_back((int32_t)v), p = end;
        }
    } else {
        std::mt19937 rng(3);
        for (int i = 0; i < 8 * B; i++) ids.push_back((int32_t)(rng() % (uint32_t)m->cfg.n_vocab));
    }
    size_t n_ids = std::min(ids.size(), (size_t)m->cfg.max_seq_len);
    if (length && *length) n_ids = std::min(n_ids, (size_t)std::max(atol(length), 0L));
    ids.resize(n_ids / B * B);
    int precision = DLLM_PRECISION_AUTO;
    const char *pname = getenv("DLLM_KVQ_PRECISION");
    for (int p = 0; pname && *pname && p <= DLLM_PRECISION_RTN_W4A16; p++)
        if (!strcmp(pname, dllm__precision_name(p))) precision = p;
    CHECK_MSG(!pname || !*pname || precision != DLLM_PRECISION_AUTO,
              "DLLM_KVQ_PRECISION=%s is no precision (bf16, soloq-n, ...)", pname);
    printf("    %s, weights %s, %zu ids\n", dir,
           precision == DLLM_PRECISION_AUTO ? "as stored" : dllm__precision_name(precision), ids.size());
    test_kvq_table(T_, m, dir, ids, B, (dllm_precision)precision);
    dllm_model_free(m);
}

// ---- bytes and options -----------------------------------------------------------------------------------------

/* Bytes per token: the formula on the tiny fixture (2 layers, 2 kv heads of 16), the store's own sizes, and the spec's
 * target on the real Fast-dLLM v2 7B shape: KV4 at most 0.31x the BF16 cache (56 KiB a token). */
TEST(kv_quant, bytes_per_token) {
    dllm_model *m = test_load(test_data("tiny-fast-dllm-v2"));
    if (!m) { CHECK(m != nullptr); return; }
    double b[5];
    for (int mode = 0; mode < 5; mode++)
        CHECK_STATUS(dllm_kv_bytes_per_token(m, (dllm_kv_quant)mode, 0, &b[mode]), DLLM_OK, nullptr);
    // per layer: K and V codes 2 x 32 x bits / 8, key pairs 32 channels x 4 bytes / 32 tokens, 4 bytes per kv head
    CHECK(b[0] == 2 * 2 * 32 * 2 && b[1] == 2 * (32 + 4 + 8) && b[2] == 2 * (16 + 4 + 8) && b[3] == b[1] &&
          b[4] == b[2]);
    double b8 = 0;
    CHECK_STATUS(dllm_kv_bytes_per_token(m, DLLM_KV_QUANT_SOLOQ_KV4, 8, &b8), DLLM_OK, nullptr);
    CHECK(b8 == 2 * (32 + 16 + 8));
    dllm_ctx *ctx = test_kvq_ctx(m, DLLM_KV_QUANT_SOLOQ_KV4);
    if (ctx) {
        CHECK_STATUS(ctx->impl->bd_begin(64), DLLM_OK, nullptr);
        std::vector<int32_t> ids(64, 5);
        dllm__bd_call pre;
        pre.kind = DLLM__BD_COMMIT, pre.ids = ids.data(), pre.T = 64, pre.mask_block = 32, pre.r0 = 63, pre.r1 = 64,
        pre.kv_group = 32;
        std::vector<float> l((size_t)m->cfg.n_vocab);
        CHECK_STATUS(ctx->impl->bd_forward(pre, l.data()), DLLM_OK, nullptr);
        const dllm__kvq &q = ((dllm__cpu_backend *)ctx->impl.get())->kv_quant();
        const double stored =
            (double)(q.k_codes.size() + q.v_codes.size() + 2 * q.k_pairs.size() + 4 * q.v_scale.size()) / 64;
        CHECK_MSG(stored == b[1], "the store holds %g bytes a token, the formula says %g", stored, b[1]);
        dllm_ctx_free(ctx);
    }
    dllm_model_free(m);
    dllm__config c;
    CHECK_STATUS(test_config(test_read_file(test_data("real-configs/fast-dllm-v2-7b.config.json")), c), DLLM_OK,
                 nullptr);
    const double bf16 = dllm__kvq_bytes_per_token(c, DLLM_KV_QUANT_NONE, 32),
                 kv4 = dllm__kvq_bytes_per_token(c, DLLM_KV_QUANT_SOLOQ_KV4, 32),
                 kv2 = dllm__kvq_bytes_per_token(c, DLLM_KV_QUANT_SOLOQ_KV2, 32);
    printf("    Fast-dLLM v2 7B: BF16 %.0f bytes/token, KV4 %.0f (%.3fx), KV2 %.0f (%.3fx)\n", bf16, kv4, kv4 / bf16,
           kv2, kv2 / bf16);
    CHECK(bf16 == 56 * 1024 && kv4 / bf16 <= 0.31 && kv2 / bf16 < 0.17);
}

/* kv_quant is validated at context creation: out of range, sinks below -1, a model without a committed cache
 * (naming the option), and the model's default sinks. */
TEST(kv_quant, options_are_validated) {
    dllm_model *llada = test_load(test_data("tiny-llada")), *bd = test_load(test_data("tiny-nemotron-diffusion"));
    if (!llada || !bd) { CHECK(llada && bd); dllm_model_free(llada); dllm_model_free(bd); return; }
    dllm_ctx_params p = dllm_ctx_default_params();
    CHECK(p.kv_quant == DLLM_KV_QUANT_NONE && p.kv_sink_tokens == -1);
    p.backend = DLLM_BACKEND_CPU, p.n_threads = 1;
    dllm_ctx *ctx = nullptr;
    p.kv_quant = DLLM_KV_QUANT_SOLOQ_KV4;
    CHECK_STATUS(dllm_ctx_create(llada, p, &ctx), DLLM_ERR_UNSUPPORTED, "kv_quant (--kv-quant) soloq-kv4");
    CHECK(ctx == nullptr);
    double bytes = 0;
    CHECK_STATUS(dllm_kv_bytes_per_token(llada, DLLM_KV_QUANT_KIVI_KV2, 0, &bytes), DLLM_ERR_UNSUPPORTED,
                 "no committed K/V cache");
    p.kv_quant = (dllm_kv_quant)5;
    CHECK_STATUS(dllm_ctx_create(bd, p, &ctx), DLLM_ERR_INVALID_ARGUMENT, "kv_quant 5");
    p.kv_quant = DLLM_KV_QUANT_KIVI_KV4, p.kv_sink_tokens = -2;
    CHECK_STATUS(dllm_ctx_create(bd, p, &ctx), DLLM_ERR_INVALID_ARGUMENT, "kv_sink_tokens (--kv-sinks) -2");
    p.kv_sink_tokens = -1;
    CHECK_STATUS(dllm_ctx_create(bd, p, &ctx), DLLM_OK, nullptr);
    if (ctx) CHECK(((dllm__cpu_backend *)ctx->impl.get())->kv_quant().n_sink == 1);  // Nemotron: position 0
    dllm_ctx_free(ctx);
    ctx = nullptr;
    p.kv_quant = DLLM_KV_QUANT_NONE;
    CHECK_STATUS(dllm_ctx_create(llada, p, &ctx), DLLM_OK, nullptr);  // none is every model's
    dllm_ctx_free(ctx);
    dllm_model_free(llada);
    dllm_model_free(bd);
}

/* The device twins (dllm__src_kvq with 9b's SoloQ functions) compile for every architecture of the table, without
 * spills; the GPU tests (test_block_diffusion_gpu.inl) run them. */
TEST(jit, kv_quant_module_compiles) {
    for (const dllm__arch &row : dllm__arch_table) {
        const dllm__arch a = dllm__arch_for(row.cc);
        const dllm__jit_request rq = dllm__module_kvq(a);
        std::vector<char> cubin;
        std::vector<std::string> lowered;
        test_compile_clean(T_, rq, a.target, false, cubin, lowered);
        CHECK(lowered.size() == 4 && cubin.size() > 1000);
    }
}

/* dllm-generate --kv-quant / --kv-sinks: the cache's bytes per token on stderr, the same ids as the library with the
 * same options, and errors naming the flag. */
TEST(kv_quant, cli_flags) {
    if (!test_cli_built()) SKIP("the CLI programs are not built");
    const std::string model = test_data("tiny-fast-dllm-v2");
    std::string ids = "--ids \"5";
    for (int i = 6; i <= 37; i++) ids += " " + std::to_string(i);
    ids += "\"";
    std::string out, err;
    int rc = test_run_cli("dllm-generate",
                          "-m " + model + " " + ids + " -n 32 --kv-quant soloq-kv2 --kv-sinks 4 --backend cpu", "", out,
                          err);
    CHECK_MSG(rc == 0 && err.find("K/V cache: 56.0 bytes per committed token, 0.219x the BF16 cache's 256") !=
                             std::string::npos,
              "exit %d: %s", rc, err.c_str());
    dllm_model *m = test_load(model);
    dllm_ctx *ctx = m ? test_kvq_ctx(m, DLLM_KV_QUANT_SOLOQ_KV2, 4) : nullptr;
    if (ctx) {
        std::vector<int32_t> prompt;
        for (int i = 5; i <= 37; i++) prompt.push_back(i);
        dllm_gen_params gp = dllm_gen_default_params();
        gp.tuned_forwards = 1;  // dllm_generate's own forwards, which this test is about
        gp.gen_length = 32, gp.block_length = 32;
        std::vector<int32_t> o(64, -1);
        int n = 0;
        CHECK_STATUS(dllm_generate(ctx, prompt.data(), (int)prompt.size(), gp, o.data(), (int)o.size(), &n, nullptr),
                     DLLM_OK, nullptr);
        std::string want = "ids:";
        for (int i = 0; i < n; i++) want += " " + std::to_string(o[(size_t)i]);
        CHECK_MSG(out.find(want + "\n") != std::string::npos, "CLI printed %s, the library %s", out.c_str(),
                  want.c_str());
    }
    dllm_ctx_free(ctx);
    dllm_model_free(m);
    rc = test_run_cli("dllm-generate", "-m " + model + " " + ids + " --kv-quant kv3", "", out, err);
    CHECK_MSG(rc == 1 && err.find("--kv-quant must be none, soloq-kv4") != std::string::npos, "exit %d: %s", rc,
              err.c_str());
    rc = test_run_cli("dllm-generate", "-m " + model + " " + ids + " --kv-sinks 2", "", out, err);
    CHECK_MSG(rc == 1 &&
                  err.find("--kv-sinks keeps sinks of a quantised cache: it needs --kv-quant") != std::string::npos,
              "exit %d: %s", rc, err.c_str());
    rc = test_run_cli("dllm-generate", "-m models/tiny-llada -p hi --kv-quant kivi-kv4", "", out, err);
    CHECK_MSG(rc == 1 && err.find("--kv-quant kivi-kv4: a LLaDA model has no committed K/V cache") != std::string::npos,
              "exit %d: %s", rc, err.c_str());
}

/* dllm_kv_bytes_per_token's bad inputs are statuses with messages naming what to change, and leave *bytes alone:
 * NULL model or bytes, kv_quant out of range, a negative block length under a quantised mode. */
TEST(kv_quant, bytes_per_token_rejects_bad_input) {
    dllm_model *m = test_load(test_data("tiny-fast-dllm-v2"));
    if (!m) { CHECK(m != nullptr); return; }
    double bytes = -7.5;
    CHECK_STATUS(dllm_kv_bytes_per_token(nullptr, DLLM_KV_QUANT_SOLOQ_KV4, 0, &bytes), DLLM_ERR_INVALID_ARGUMENT,
                 "must not be NULL");
    CHECK_STATUS(dllm_kv_bytes_per_token(m, DLLM_KV_QUANT_SOLOQ_KV4, 0, nullptr), DLLM_ERR_INVALID_ARGUMENT,
                 "must not be NULL");
    CHECK_STATUS(dllm_kv_bytes_per_token(m, (dllm_kv_quant)5, 0, &bytes), DLLM_ERR_INVALID_ARGUMENT, "kv_quant 5");
    CHECK_STATUS(dllm_kv_bytes_per_token(m, (dllm_kv_quant)-1, 0, &bytes), DLLM_ERR_INVALID_ARGUMENT, "kv_quant -1");
    CHECK_STATUS(dllm_kv_bytes_per_token(m, DLLM_KV_QUANT_KIVI_KV2, -3, &bytes), DLLM_ERR_INVALID_ARGUMENT,
                 "block_length -3");
    CHECK(bytes == -7.5);
    CHECK_STATUS(dllm_kv_bytes_per_token(m, DLLM_KV_QUANT_NONE, 0, &bytes), DLLM_OK, nullptr);
    CHECK(bytes == 2 * 2 * 32 * 2);
    dllm_model_free(m);
}
