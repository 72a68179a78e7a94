/* src/cpu/backend.cpp - the CPU reference backend. */

class dllm__cpu_backend : public dllm__backend_impl {
  public:
    dllm__cpu_backend(const dllm_model &m, int n_threads, int max_tokens, dllm_precision precision,
                      const dllm__soloq_options &soloq, int kv_quant = DLLM_KV_QUANT_NONE, int kv_sinks = -1,
                      const dllm__progress &progress = dllm__progress())
        : m_(m), pool_(n_threads), fp8_(dllm__cpu_fp8_weights(m, precision, progress)) {
        dllm__rope_tables_cfg(m.cfg, max_tokens, cos_, sin_);
        if (soloq.enabled) fp8_ = dllm__cpu_soloq_weights(m, pool_, soloq, head_, progress);
        kvq_.setup(m.cfg, kv_quant, kv_sinks);
    }

    /* Block diffusion's committed cache as attention reads it, and its quantised form (tests). */
    DLLM__TEST_HOOKS_BEGIN
    DLLM__TEST_HOOK const dllm__bd_kv &bd_kv() const { return bd_kv_; }
    DLLM__TEST_HOOK const dllm__kvq &kv_quant() const { return kvq_; }
    DLLM__TEST_HOOKS_END

    dllm_status logits(const int32_t *ids, int n, int r0, int r1, float *out) override {
        if (dllm__is_block_diffusion(m_.cfg) || m_.cfg.family == DLLM_FAMILY_LLADA2)
            return bd_logits(ids, n, r0, r1, out);
        forward(ids, n, dllm__cpu_rows(), r0, r1, out);
        return DLLM_OK;
    }

    dllm_status bd_begin(int rows) override {
        bd_kv_.reset(m_.cfg, rows);
        if (kvq_.enabled()) kvq_.reset(rows);
        return DLLM_OK;
    }

    dllm_status bd_forward(const dllm__bd_call &call, float *logits) override {
        return bd_forward_on(bd_kv_, kvq_, call, logits);
    }

    /* [batch] [block diffusion] The reference: a slot is what bd_begin makes for a generation alone
     * (its committed cache, block cache and [FACache] state, and under kv_quant its own codes), and bd_forward_batch
     * runs each sequence through bd_forward's code on its slot, one after another, so every result is bd_forward's bit
     * for bit. */
    using dllm__backend_impl::bd_batch_reserve;  // the one-list form too (every slot empty)
    dllm_status bd_batch_reserve(const std::vector<int> &rows, const std::vector<bool> &keep) override {
        DLLM__TRY(dllm__check_kept_slots(rows, keep, bd_slot_rows_));
        std::vector<bd_slot> slots(rows.size());
        for (size_t s = 0; s < rows.size(); s++) {
            if (s < keep.size() && keep[s]) {
                slots[s] = std::move(bd_slots_[s]);
                continue;
            }
            slots[s].kv.reset(m_.cfg, rows[s]);
            slots[s].kvq.setup(m_.cfg, kvq_.mode, kvq_.n_sink);
            if (kvq_.enabled()) slots[s].kvq.reset(rows[s]);
        }
        bd_slots_.swap(slots), bd_slot_rows_ = rows;
        return DLLM_OK;
    }
    /* Each sequence's logits, or a step's choices by dllm__choose over them, as dllm__bd_generation::forward_choose
     * makes them on the host (every row of the pick: the caller reads the masked ones). */
    dllm_status bd_forward_batch(const std::vector<dllm__bd_seq> &seqs, float *logits, dllm__choice *choices) override {
        const int V = m_.cfg.n_vocab;
        std::vector<bool> seen(bd_slots_.size(), false);
        for (size_t i = 0; i < seqs.size(); i++) {
            const int slot = seqs[i].slot;
            if (slot < 0 || (size_t)slot >= bd_slots_.size() || seen[(size_t)slot])
                return dllm__fail(
                    DLLM_ERR_INTERNAL,
                    "batched block diffusion: sequence %zu names slot %d (%zu reserved, each once a forward)", i, slot,
                    bd_slots_.size());
            if (!(seqs[i].pick ? (void *)choices : (void *)logits))
                return dllm__fail(DLLM_ERR_INTERNAL,
                                  "batched block diffusion: sequence %zu has %s to return and no array for them", i,
                                  seqs[i].pick ? "choices" : "logits");
            seen[(size_t)slot] = true;
        }
        for (const dllm__bd_seq &s : seqs) {
            bd_slot &slot = bd_slots_[(size_t)s.slot];
            const size_t rows = (size_t)(s.call.r1 - s.call.r0);
            if (!s.pick) {
                DLLM__TRY(bd_forward_on(slot.kv, slot.kvq, s.call, logits));
                logits += rows * V;
                continue;
            }
            bd_raw_.resize(rows * V);
            DLLM__TRY(bd_forward_on(slot.kv, slot.kvq, s.call, bd_raw_.data()));
            const dllm__bd_pick &pick = *s.pick;
            for (int i = 0; i < pick.n; i++)
                *choices++ = dllm__choose(bd_raw_.data() + (size_t)pick.logits_row(i) * V, V, pick.sampling,
                                          (uint32_t)(pick.pos0 + i), 0);
        }
        return DLLM_OK;
    }

    void bd_facache_rows(int64_t &rows, int64_t &reused) const override {
        rows = bd_kv_.fa.rows, reused = bd_kv_.fa.rows_reused;
    }

    dllm_status begin_block(dllm__decode &st) override {
        st.n_block_masks = dllm__count_masks(st, st.block_begin, st.block_end);
        return DLLM_OK;
    }

    dllm_status step(dllm__decode &st, std::vector<int32_t> &committed, bool) override {
        const int V = m_.cfg.n_vocab;
        dllm__step_begin(st, work_);
        const size_t n = (size_t)(work_.r1 - work_.r0) * V;
        cond_.resize(n);
        forward(st.canvas.data(), (int)st.canvas.size(), rows_for(st, kv_[0]), work_.r0, work_.r1, cond_.data());
        if (st.cfg_scale > 0) {
            std::vector<int32_t> un;
            dllm__uncond_canvas(st, un);
            uncond_.resize(n);
            forward(un.data(), (int)un.size(), rows_for(st, kv_[1]), work_.r0, work_.r1, uncond_.data());
        }
        dllm__step_end(st, work_, cond_.data(), st.cfg_scale > 0 ? uncond_.data() : nullptr, V, committed);
        return DLLM_OK;
    }

    dllm__batch_caps batch_caps() const override { return {}; }  // all three batched forwards
    /* Every canvas's rows in one dllm__cpu_forward_seqs: bit-identical to each alone. */
    dllm_status forward_batch(const std::vector<dllm__batch_seq> &plan, float *out) override {
        const dllm__config &c = m_.cfg;
        std::vector<dllm__cpu_seq> seqs(plan.size());
        size_t raw_rows = 0;
        for (size_t i = 0; i < plan.size(); i++) {
            seqs[i].ids = plan[i].ids, seqs[i].n = plan[i].n, seqs[i].rows.positions = plan[i].positions;
            seqs[i].r0 = dllm__logit_row(c, plan[i].r0), seqs[i].r1 = dllm__logit_row(c, plan[i].r1 - 1) + 1;
            raw_rows += (size_t)(seqs[i].r1 - seqs[i].r0);
        }
        raw_.resize(raw_rows * c.n_vocab);
        if (!plan.empty())
            dllm__cpu_forward_seqs(m_, pool_, buf_, seqs, cos_.data(), sin_.data(), raw_.data(), fp8_, head_.get());
        const float *raw = raw_.data();
        for (size_t i = 0; i < plan.size(); i++) {
            dllm__unshift_rows(c, raw, seqs[i].r0, plan[i].r0, plan[i].r1, out);
            raw += (size_t)(seqs[i].r1 - seqs[i].r0) * c.n_vocab;
            out += (size_t)(plan[i].r1 - plan[i].r0) * c.n_vocab;
        }
        return DLLM_OK;
    }

    /* [batch] [dual cache] [prefix cache] The reference: each sequence's cached forward over its own slot, one after
     * another (rows_for's, with the slot in place of kv_), so its logits are those of its step decoded alone. */
    using dllm__backend_impl::batch_kv_reserve;
    dllm_status batch_kv_reserve(const std::vector<int> &rows, const std::vector<bool> &keep) override {
        DLLM__TRY(dllm__check_kept_slots(rows, keep, batch_kv_rows_));
        std::vector<dllm__cpu_kv> slots(rows.size());
        for (size_t s = 0; s < keep.size() && s < rows.size(); s++)
            if (keep[s]) slots[s] = std::move(batch_kv_[s]);
        batch_kv_.swap(slots), batch_kv_rows_ = rows;
        return DLLM_OK;
    }
    dllm_status forward_batch_kv(const std::vector<dllm__batch_seq> &plan, float *out) override {
        const dllm__config &c = m_.cfg;
        for (size_t i = 0; i < plan.size(); i++) {
            const dllm__batch_seq &s = plan[i];
            if (s.slot < 0 || (size_t)s.slot >= batch_kv_.size() || s.n > batch_kv_rows_[(size_t)s.slot] || s.q0 < 0 ||
                s.q1 > s.n || s.q0 >= s.q1 || (s.fill && (s.q0 != 0 || s.q1 != s.n)))
                return dllm__fail(
                    DLLM_ERR_INTERNAL,
                    "batched K/V-cache step: sequence %zu (slot %d, %d rows, rows [%d, %d)) does not fit its cache", i,
                    s.slot, s.n, s.q0, s.q1);
            dllm__cpu_kv &kv = batch_kv_[(size_t)s.slot];
            if (s.fill) {
                kv.n = s.n;
                const size_t elems = (size_t)c.n_layer * kv.n * c.n_head_kv * c.head_dim;
                kv.k.assign(elems, 0.0f);
                kv.v.assign(elems, 0.0f);
            } else if (kv.n != s.n) {
                return dllm__fail(DLLM_ERR_INTERNAL, "batched K/V-cache step: sequence %zu has %d rows, its cache %d",
                                  i, s.n, kv.n);
            }
            dllm__cpu_rows rows;
            rows.q0 = s.q0, rows.q1 = s.q1, rows.positions = s.positions, rows.kv = &kv;
            forward(s.ids, s.n, rows, s.r0, s.r1, out);
            out += (size_t)(s.r1 - s.r0) * c.n_vocab;
        }
        return DLLM_OK;
    }

  private:
    /* bd_forward on the committed cache kv (kvq: its codes under kv_quant). */
    dllm_status bd_forward_on(dllm__bd_kv &kv, dllm__kvq &kvq, const dllm__bd_call &call, float *logits) {
        if (call.kind == DLLM__BD_SUB_BLOCK && call.offset + call.T > kv.block_rows)
            return dllm__fail(DLLM_ERR_INTERNAL,
                              "block diffusion: a sub-block forward at %d outside the block cache (%d rows)",
                              call.offset, kv.block_rows);
        const int scratch = call.kind == DLLM__BD_SUB_BLOCK ? kv.block_rows : call.T;
        if (kv.n + scratch > kv.cap || kv.n + call.offset + call.T > (int)(cos_.size() / dllm__rope_columns(m_.cfg)))
            return dllm__fail(
                DLLM_ERR_INTERNAL,
                "block diffusion: a forward of %d rows past %d committed ones overflows the K/V cache (%d rows)",
                call.T, kv.n, kv.cap);
        const int row0 = kv.n;
        dllm__cpu_bd_forward(m_, pool_, buf_, kv, call, cos_.data(), sin_.data(), logits, fp8_, head_.get());
        if (call.kind == DLLM__BD_COMMIT && kvq.enabled())
            return dllm__kvq_commit(pool_, kvq, kv, row0, call.T, call.kv_group ? call.kv_group : m_.cfg.bd_size);
        return DLLM_OK;
    }

    /* Logits of canvas positions [r0, r1) (shift applied) from a forward over the given rows. */
    void forward(const int32_t *ids, int n, const dllm__cpu_rows &rows, int r0, int r1, float *out) {
        const dllm__config &c = m_.cfg;
        int raw0 = dllm__logit_row(c, r0), raw1 = dllm__logit_row(c, r1 - 1) + 1;
        raw_.resize((size_t)(raw1 - raw0) * c.n_vocab);
        dllm__cpu_forward(m_, pool_, buf_, ids, n, rows, nullptr, cos_.data(), sin_.data(), raw0, raw1, raw_.data(),
                          fp8_, head_.get());
        dllm__unshift_rows(c, raw_.data(), raw0, r0, r1, out);
    }

    /* dllm_logits on a block-diffusion model: its plain forward without a cache, block-causal at the
     * granularity its forward uses when none is named, positions from 0, shift applied. */
    dllm_status bd_logits(const int32_t *ids, int n, int r0, int r1, float *out) {
        const dllm__config &c = m_.cfg;
        dllm__bd_kv kv;
        kv.reset(c, n);
        dllm__bd_call call;
        call.ids = ids, call.T = n, call.mask_block = c.bd_mask_block;
        call.r0 = dllm__logit_row(c, r0), call.r1 = dllm__logit_row(c, r1 - 1) + 1;
        raw_.resize((size_t)(call.r1 - call.r0) * c.n_vocab);
        dllm__cpu_bd_forward(m_, pool_, buf_, kv, call, cos_.data(), sin_.data(), raw_.data(), fp8_, head_.get());
        dllm__unshift_rows(c, raw_.data(), call.r0, r0, r1, out);
        return DLLM_OK;
    }

    /* This step's rows and keys (see dllm__step_rows); the K/V cache is sized at the block's first step. */
    dllm__cpu_rows rows_for(const dllm__decode &st, dllm__cpu_kv &kv) {
        const dllm__config &c = m_.cfg;
        dllm__cpu_rows rows;
        dllm__step_rows(st, c.shift_logits, rows.q0, rows.q1);
        rows.positions = st.positions.empty() ? nullptr : st.positions.data();
        if (st.kv_cache == DLLM_KV_CACHE_NONE) return rows;
        if (st.step_in_block == 0) {
            kv.n = (int)st.canvas.size();
            size_t elems = (size_t)c.n_layer * kv.n * c.n_head_kv * c.head_dim;
            kv.k.assign(elems, 0.0f);
            kv.v.assign(elems, 0.0f);
        }
        rows.kv = &kv;
        return rows;
    }

    const dllm_model &m_;
    dllm__pool pool_;
    std::vector<dllm__fp8_layer>
        fp8_;  // FP8 / SoloQ precisions: weights kept as codes + scales (1 byte or 4-4.5 bits a weight, as on the GPU)
    std::shared_ptr<const dllm__soloq_layer> head_;  // SoloQ with quantize_lm_head
    dllm__cpu_buffers buf_;
    dllm__cpu_kv kv_[2];                  // conditional and (CFG) unconditional canvases
    std::vector<dllm__cpu_kv> batch_kv_;  // [batch] the K/V caches of a batched decode's sequences (batch_kv_reserve)
    std::vector<int> batch_kv_rows_;      // their capacities in rows
    dllm__bd_kv bd_kv_;                   // block diffusion's committed blocks and block cache
    dllm__kvq kvq_;                       // kv_quant: the committed blocks' codes (bd_kv_ holds their decoded values)
    struct bd_slot {
        dllm__bd_kv kv;
        dllm__kvq kvq;
    };
    std::vector<bd_slot>
        bd_slots_;  // [batch] the committed caches of a batched block-diffusion decode (bd_batch_reserve)
    std::vector<int> bd_slot_rows_;  // their capacities in rows
    std::vector<float> bd_raw_;      // a batched step's logits, before its choice
    std::vector<float> cos_, sin_, raw_, cond_, uncond_;
    dllm__step_work work_;
};
