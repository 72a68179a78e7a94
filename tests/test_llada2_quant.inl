/* Tests: LLaDA2 in the quantised precisions on the CPU backend (FP8, FP8-all, every SoloQ precision and RTN). The
 * forward against the naive double-precision forward of test_llada2.inl whose every linear is replaced by a reference
 * built here from the twins (dllm__quantize_blocks, dllm__make_rotation, dllm__rotate, dllm__q4_quantize,
 * dllm__q4_fake_quantize), the router exact; a quantised checkpoint against quantising at load, bit for bit; the
 * refusals (widths SoloQ cannot take, the GPU backend, damaged or mismatched checkpoints). Batches: test_stepper.inl.
 */

// ---- the per-linear reference ------------------------------------------------------------------------------------

/* Every linear of a LLaDA2 checkpoint as `precision` computes it: its rows as the precision stores them, dequantised,
 * and how its input is treated (FP8: 1x128 groups; SoloQ: rotated by the site's R, then quantised per token unless
 * -W4A16). Built per stacked weight (Q|K|V, gate|up: FP8's 128x128 blocks span the stack), from the BF16 values. */
struct test_llada2_qref : test_llada2_linear {
    struct linear {
        std::vector<float> w;  // [out][in], dequantised
        int in = 0;
        bool fp8 = false;
        std::shared_ptr<const dllm__rotation> rot;  // SoloQ
    };
    std::map<std::string, linear> by_name;
    dllm__soloq_options o;

    std::vector<double> apply(const std::string &name, const std::vector<double> &x, int out) const override {
        const linear &L = by_name.at(name);
        std::vector<float> xf(x.begin(), x.end()), rotated((size_t)L.in);  // the fp32 input the forward holds
        if (L.fp8) dllm__fake_quantize_groups(xf.data(), 1, L.in);
        if (L.rot) {
            dllm__rotate(*L.rot, xf.data(), rotated.data());
            if (o.quantize_acts) dllm__q4_fake_quantize(o.acts, rotated.data(), 1, L.in, o.bias_correction);
            xf = rotated;
        }
        std::vector<double> y((size_t)out, 0.0);
        for (int r = 0; r < out; r++)
            for (int i = 0; i < L.in; i++) y[(size_t)r] += (double)L.w[(size_t)r * L.in + i] * xf[(size_t)i];
        return y;
    }

    /* The tensors `names` stacked by rows, quantised (or kept exact) as one weight of layer `layer` at `site`. */
    void add(const test_llada2_weights &tw, int layer, int site, const std::vector<std::string> &names,
             bool quantised) {
        const int in = (int)tw.shape.at(names[0])[1];
        std::vector<float> w;
        for (const std::string &n : names)
            for (float v : tw[n]) w.push_back(quantised ? dllm__bf16_to_f32(dllm__f32_to_bf16(v)) : v);
        const int rows = (int)(w.size() / (size_t)in);
        std::shared_ptr<const dllm__rotation> rot;
        if (quantised && o.enabled) {
            rot = std::make_shared<const dllm__rotation>(
                dllm__make_rotation(o.rotation, in, o.seed, (uint32_t)(layer * 8 + site)));
            std::vector<float> tmp((size_t)in);
            for (int r = 0; r < rows; r++) {
                dllm__rotate(*rot, &w[(size_t)r * in], tmp.data());
                std::copy(tmp.begin(), tmp.end(), w.begin() + (size_t)r * in);
            }
            const dllm__q4_rows q = dllm__q4_quantize(nullptr, o.weights, w.data(), rows, in, o.bias_correction);
            for (int r = 0; r < rows; r++) dllm__q4_row(q, r, &w[(size_t)r * in]);
        } else if (quantised) {
            const dllm__fp8_matrix q = dllm__quantize_blocks(w.data(), rows, in);
            for (int r = 0; r < rows; r++) q.row(r, &w[(size_t)r * in]);
        }
        size_t at = 0;
        for (const std::string &n : names) {
            linear &L = by_name[n];
            L.in = in, L.rot = rot, L.fp8 = quantised && !o.enabled;
            L.w.assign(w.begin() + (long)at, w.begin() + (long)(at + tw[n].size()));
            at += tw[n].size();
        }
    }
};

/* The reference of checkpoint tw at `precision` (head: SoloQ's quantize_lm_head). FP8 leaves layer 0 exact (LaCache),
 * fp8 quantises the FFN linears (dense MLP, shared and routed experts), fp8-all the attention projections too; SoloQ
 * every linear of every layer. */
static test_llada2_qref test_llada2_qref_of(const test_llada2_shape &s, const test_llada2_weights &tw, int precision,
                                            int head) {
    test_llada2_qref r;
    dllm__soloq_options_for(precision, head, DLLM_SOLOQ_ROTATION_DEFAULT, -1, r.o);
    const bool fp8 = precision == DLLM_PRECISION_FP8_FFN || precision == DLLM_PRECISION_FP8_ALL;
    for (int l = 0; l < s.n_layer; l++) {
        const std::string p = dllm__format("model.layers.%d.", l), attn = p + "attention.", mlp = p + "mlp.";
        const bool ffn_q = r.o.enabled || (fp8 && l > 0),
                   attn_q = r.o.enabled || (precision == DLLM_PRECISION_FP8_ALL && l > 0);
        r.add(tw, l, DLLM__SOLOQ_QKV, {attn + "query_key_value.weight"}, attn_q);
        r.add(tw, l, DLLM__SOLOQ_O, {attn + "dense.weight"}, attn_q);
        auto swiglu = [&](const std::string &pre) {
            r.add(tw, l, DLLM__SOLOQ_GU, {pre + "gate_proj.weight", pre + "up_proj.weight"}, ffn_q);
            r.add(tw, l, DLLM__SOLOQ_DOWN, {pre + "down_proj.weight"}, ffn_q);
        };
        if (l < s.dense) {
            swiglu(mlp);
            continue;
        }
        swiglu(mlp + "shared_experts.");
        for (int e = 0; e < s.E; e++) swiglu(mlp + dllm__format("experts.%d.", e));
    }
    r.add(tw, s.n_layer, DLLM__SOLOQ_HEAD, {"lm_head.weight"}, r.o.enabled && head);
    return r;
}

/* Widths SoloQ takes (multiples of 8) but awkward: NVFP4's 16-blocks split the hidden size 40, the shared expert
 * (2 x 16) is wider than a routed one, 12 experts in 4 groups. */
static test_llada2_shape test_llada2_quant_shape() {
    test_llada2_shape s;
    s.moe_ff = 16, s.shared = 2;
    return s;
}

static double test_nmse_d(const std::vector<float> &a, const std::vector<double> &b, size_t b0) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); i++) {
        const double e = (double)a[i] - b[b0 + i];
        num += e * e, den += b[b0 + i] * b[b0 + i];
    }
    return num / den;
}

// ---- the forward ---------------------------------------------------------------------------------------------------

/* dllm_logits under each precision (rows 3.. of two blocks, the second partial; fresh ids per precision) equals the
 * naive forward on the reference's linears: under -W4A16 (no activation rounding) to fp32 accuracy; under W4A4 and FP8
 * closer to it than a thousandth of the precision's own change (an input near a rounding boundary may round the other
 * way in fp32 than in double). A precision that quantised any linear otherwise, or the router, would be as far from
 * the reference as from the exact forward. */
TEST(llada2_quant, forward_equals_per_linear_reference) {
    const test_llada2_shape s = test_llada2_quant_shape();
    const test_llada2_weights tw = test_llada2_random(s, 21);
    test_tmpdir dir;
    dllm_model *m = test_llada2_load(T_, dir, s, tw);
    if (!m) return;
    struct { int precision, head; } cases[] = {
        {DLLM_PRECISION_FP8_FFN, 0},      {DLLM_PRECISION_FP8_ALL, 0},       {DLLM_PRECISION_SOLOQ_N, 0},
        {DLLM_PRECISION_SOLOQ_N, 1},      {DLLM_PRECISION_SOLOQ_I, 0},       {DLLM_PRECISION_SOLOQ_C, 0},
        {DLLM_PRECISION_RTN_W4A4, 0},     {DLLM_PRECISION_SOLOQ_N_W4A16, 0}, {DLLM_PRECISION_SOLOQ_C_W4A16, 1},
        {DLLM_PRECISION_RTN_W4A16, 0},
    };
    std::mt19937 rng(0x11ad2);
    const int n = 45, r0 = 3;
    for (auto &c : cases) {
        std::vector<int32_t> ids((size_t)n);
        for (int32_t &t : ids) t = (int32_t)(rng() % (uint32_t)(s.V - 2));
        dllm_ctx_params cp = dllm_ctx_default_params();
        cp.backend = DLLM_BACKEND_CPU, cp.n_threads = 2, cp.precision = (dllm_precision)c.precision;
        cp.quantize_lm_head = c.head;
        dllm_ctx *ctx = nullptr;
        CHECK_STATUS(dllm_ctx_create(m, cp, &ctx), DLLM_OK, nullptr);
        std::vector<float> got((size_t)(n - r0) * s.V, NAN);
        CHECK(ctx && dllm_logits(ctx, ids.data(), n, r0, n, got.data(), got.size()) == DLLM_OK);
        dllm_ctx_free(ctx);
        const test_llada2_qref ref = test_llada2_qref_of(s, tw, c.precision, c.head);
        const double to_ref = test_nmse_d(got, test_naive_forward(s, tw, ids, 32, &ref), (size_t)r0 * s.V),
                     to_exact = test_nmse_d(got, test_naive_forward(s, tw, ids, 32), (size_t)r0 * s.V);
        const bool w4a16 = c.precision >= DLLM_PRECISION_SOLOQ_N_W4A16;
        printf("    %-14s%s: logits NMSE to the reference %.2e, to the exact forward %.2e\n",
               dllm__precision_name(c.precision), c.head ? " + head" : "", to_ref, to_exact);
        CHECK_MSG(to_exact > 1e-6 && (w4a16 ? to_ref < 1e-10 : to_ref < 1e-3 * to_exact), "%s: %.3e vs %.3e",
                  dllm__precision_name(c.precision), to_ref, to_exact);
    }
    dllm_model_free(m);
}

// ---- quantised checkpoints -----------------------------------------------------------------------------------------

/* dllm_model_quantize writes every linear of a LLaDA2 (fused Q|K|V, O, the dense MLP, each routed expert's and the
 * shared expert's gate|up and down); loaded back, a context on it gives the logits of quantising the source at
 * creation bit for bit, and so does the other activation treatment; router, expert biases and QK-norms stay as they
 * were. On the random checkpoint (awkward widths) and on models/tiny-llada2. */
TEST(llada2_quant, stored_checkpoint_gives_the_logits_of_quantising_at_load_bit_for_bit) {
    const test_llada2_shape s = test_llada2_quant_shape();
    test_tmpdir random_dir;
    test_llada2_write(random_dir, s, test_llada2_random(s, 22));
    struct { std::string src; dllm_precision p; int head; size_t shard; } cases[] = {
        {random_dir.path, DLLM_PRECISION_SOLOQ_I, 0, 0},
        {random_dir.path, DLLM_PRECISION_SOLOQ_N, 1, 20000},
        {"models/tiny-llada2", DLLM_PRECISION_SOLOQ_C, 0, 0},
        {"models/tiny-llada2", DLLM_PRECISION_RTN_W4A16, 1, 0},
    };
    for (auto &c : cases) {
        test_tmpdir dir;
        dllm_model *src = test_load(c.src), *q = test_quantized(c.src, dir, c.p, c.head, c.shard);
        if (!src || !q) {
            CHECK_MSG(false, "%s %s: not loaded", c.src.c_str(), dllm__precision_name(c.p));
            dllm_model_free(src);
            dllm_model_free(q);
            continue;
        }
        const dllm__layer_weights &L0 = q->layers[0], &L1 = q->layers[1];
        CHECK(q->soloq && L0.wqkv == nullptr && L0.gate == nullptr && L1.expert_gate[0] == nullptr &&
              L1.expert_down.back() == nullptr && L1.shared_up == nullptr && (q->head == nullptr) == (c.head == 1));
        CHECK(L1.router && L1.expert_bias.size() == (size_t)q->cfg.n_expert && !L1.q_norm.empty());
        CHECK(q->soloq->layers[1]->expert_gu.size() == (size_t)q->cfg.n_expert && q->n_params == src->n_params);
        if (c.shard) CHECK(q->files.size() > 1);
        const std::vector<int32_t> ids = test_quant_ids(src, 45);
        const std::vector<float> want = test_quant_logits(src, c.p, c.head, ids),
                                 got = test_quant_logits(q, DLLM_PRECISION_AUTO, 0, ids);
        CHECK_MSG(test_bitwise_equal(want, got), "%s %s: the stored rows' logits differ from quantising at load",
                  c.src.c_str(), dllm__precision_name(c.p));
        CHECK_MSG(!test_bitwise_equal(want, test_quant_logits(src, DLLM_PRECISION_BF16, 0, ids)),
                  "%s %s: quantising changed nothing", c.src.c_str(), dllm__precision_name(c.p));
        const dllm_precision other = (dllm_precision)(c.p >= DLLM_PRECISION_SOLOQ_N_W4A16 ? c.p - 4 : c.p + 4);
        CHECK_MSG(test_bitwise_equal(test_quant_logits(src, other, c.head, ids), test_quant_logits(q, other, 0, ids)),
                  "%s %s", c.src.c_str(), dllm__precision_name(other));
        dllm_model_free(src);
        dllm_model_free(q);
    }
}

// ---- refusals -------------------------------------------------------------------------------------------------------

/* SoloQ on widths that are not multiples of 8 (tests/data/llada2's experts are 12 wide) is refused at context creation
 * and by dllm_model_quantize, while FP8 takes them; the GPU backend refuses every quantised precision for LLaDA2 naming
 * both ways out; a stored checkpoint missing one expert's part, or whose config no longer matches, names it. */
TEST(llada2_quant, refusals_name_the_setting) {
    dllm_model *m = test_load(test_data("llada2"));
    if (!m) { CHECK(m != nullptr); return; }
    CHECK(m->cfg.n_ff_expert % 8 != 0);
    dllm_ctx_params cp = dllm_ctx_default_params();
    cp.backend = DLLM_BACKEND_CPU, cp.n_threads = 2, cp.precision = DLLM_PRECISION_SOLOQ_I;
    dllm_ctx *ctx = nullptr;
    CHECK_STATUS(dllm_ctx_create(m, cp, &ctx), DLLM_ERR_UNSUPPORTED, "multiple of 8; this model has 12");
    test_tmpdir out;
    dllm_quantize_params qp = dllm_quantize_default_params();
    CHECK_STATUS(dllm_model_quantize(m, out.path.c_str(), &qp), DLLM_ERR_UNSUPPORTED, "multiple of 8");
    cp.precision = DLLM_PRECISION_FP8_ALL;
    CHECK_STATUS(dllm_ctx_create(m, cp, &ctx), DLLM_OK, nullptr);
    dllm_ctx_free(ctx), ctx = nullptr;
    dllm_model_free(m);

    const test_llada2_shape s = test_llada2_quant_shape();
    test_tmpdir src, good;
    test_llada2_write(src, s, test_llada2_random(s, 23));
    dllm_model *unquantised = test_load(src.path), *q = test_quantized(src.path, good, DLLM_PRECISION_SOLOQ_N, 0);
    if (!q || !unquantised) { CHECK(q && unquantised); dllm_model_free(q); dllm_model_free(unquantised); return; }
    for (dllm_model *on : {unquantised, q}) {  // FP8; the stored SoloQ-N (AUTO)
        cp = dllm_ctx_default_params(), cp.backend = DLLM_BACKEND_GPU;
        cp.precision = on == q ? DLLM_PRECISION_AUTO : DLLM_PRECISION_FP8_FFN;
        if (test_have_gpu())
            CHECK_STATUS(dllm_ctx_create(on, cp, &ctx), DLLM_ERR_UNSUPPORTED, "(--precision bf16), or the CPU backend");
        else
            CHECK_STATUS(dllm_ctx_create(on, cp, &ctx), DLLM_ERR_NO_DEVICE, nullptr);
        dllm_ctx_free(ctx), ctx = nullptr;
    }
    dllm_model_free(q);
    dllm_model_free(unquantised);

    test_tmpdir damaged;
    test_write_file(damaged.file("config.json"), test_read_file(good.file("config.json")));
    test_qfile f = test_qfile_of(good);
    const std::string gone = "model.layers.2.soloq.experts.7.down.row_scale";
    CHECK(test_qfile_tensor(f, gone) != nullptr);
    f.tensors.erase(std::remove_if(f.tensors.begin(), f.tensors.end(),
                                   [&](const test_st_builder::entry &e) { return e.name == gone; }),
                    f.tensors.end());
    test_write_file(damaged.file("model.safetensors"), test_qfile_bytes(f));
    dllm_model *bad = nullptr;
    const std::string missing = "missing tensor " + gone;
    CHECK_STATUS(dllm_model_load(damaged.path.c_str(), dllm_model_default_params(), &bad), DLLM_ERR_SHAPE,
                 missing.c_str());
    dllm_model_free(bad), bad = nullptr;
    test_llada2_shape wider = s;
    wider.moe_ff = 24;
    test_write_file(good.file("config.json"), test_llada2_config(wider));
    CHECK_STATUS(dllm_model_load(good.path.c_str(), dllm_model_default_params(), &bad), DLLM_ERR_SHAPE,
                 "is not the one config.json describes");
    dllm_model_free(bad);
}
