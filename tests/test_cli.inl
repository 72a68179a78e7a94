/* Tests: the library as a new user meets it (version, sampler filters, model info, buffer sizes) and the
 * contract of the CLI programs: exit status, stdout and stderr (issue 27). The CLI tests run the built
 * binaries from the repository root and skip where they are not built. */

TEST(api, version_string_matches_the_header) {
    char want[64];
    snprintf(want, sizeof want, "%d.%d.%d", DLLM_VERSION_MAJOR, DLLM_VERSION_MINOR, DLLM_VERSION_PATCH);
    CHECK_MSG(strcmp(dllm_version(), want) == 0, "dllm_version() = \"%s\", header %s", dllm_version(), want);
}

TEST(api, model_info_reads_bos_from_generation_config) {
    dllm_model *m = test_load(test_data("tiny-llada"));  // config.json names no BOS; generation_config.json does
    dllm_model_info info;
    if (!m) { CHECK(m != nullptr); return; }
    CHECK_STATUS(dllm_model_get_info(m, &info), DLLM_OK, nullptr);
    CHECK_MSG(info.bos_id == 127 && info.eos_id == 128, "bos %d eos %d", info.bos_id, info.eos_id);
    dllm_model_free(m);
}

TEST(api, missing_model_directory_says_so) {
    dllm_model *m = nullptr;
    CHECK_STATUS(dllm_model_load("/nonexistent-dllm-dir", dllm_model_default_params(), &m), DLLM_ERR_IO,
                 "No such file or directory");
    CHECK(strstr(dllm_last_error(), "config.json") == nullptr);
    CHECK_STATUS(dllm_model_load("tests/data/tiny-llada/config.json", dllm_model_default_params(), &m), DLLM_ERR_IO,
                 "not a directory");
}

TEST(api, small_output_buffer_reports_the_size_needed) {
    dllm_model *m = test_load(test_data("tiny-llada"));
    dllm_ctx *ctx = m ? test_ctx(m) : nullptr;
    if (!ctx) { CHECK(ctx != nullptr); dllm_model_free(m); return; }
    int32_t prompt[3] = {1, 2, 3}, out[16];
    for (int32_t &o : out) o = -7;
    dllm_gen_params p = dllm_gen_default_params();
    p.gen_length = 16; p.steps = 16; p.block_length = 8;
    int n = -1;
    CHECK_STATUS(dllm_generate(ctx, prompt, 3, p, out, 10, &n, nullptr), DLLM_ERR_BUFFER_TOO_SMALL,
                 "gen_length (-n) = 16");
    CHECK_MSG(n == 16, "*n_out = %d, want the 16 needed", n);
    for (int32_t o : out) CHECK(o == -7);  // nothing written
    dllm_ctx_free(ctx);
    dllm_model_free(m);
}

// ---- the sampler filters (top-k, top-p, min-p) ------------------------------------------------------

TEST(choose, filter_cutoffs_follow_the_header) {
    // logits with a tie at 2.0; softmax masses (T = 1): 3.0 -> 0.4309, 2.0 -> 0.1585 each, 1.0 -> 0.0583, ...
    std::vector<float> row = {2.0f, 3.0f, -1.0f, 2.0f, 1.0f, NAN, 0.0f};
    dllm__sampling s;
    CHECK(dllm__row_cutoff(row, s) == -INFINITY);  // no filter keeps everything
    s.top_k = 1;
    CHECK(dllm__row_cutoff(row, s) == 3.0f);
    s.top_k = 2;  // the 2nd largest is 2.0, tied: both 2.0s kept
    CHECK(dllm__row_cutoff(row, s) == 2.0f);
    s.top_k = 6;  // six non-NaN logits: the smallest is the cut
    CHECK(dllm__row_cutoff(row, s) == -1.0f);
    s.top_k = 7;  // more than there are: off
    CHECK(dllm__row_cutoff(row, s) == -INFINITY);
    s.top_k = 0;
    double z = 0;
    for (float l : row)
        if (l == l) z += exp(l - 3.0);
    const double p3 = 1 / z, p2 = exp(-1.0) / z;
    s.top_p = (float)(p3 * 0.999);  // the top token alone reaches it
    CHECK(dllm__row_cutoff(row, s) == 3.0f);
    s.top_p = (float)(p3 + 0.5 * p2);  // needs one 2.0: the tie keeps both
    CHECK(dllm__row_cutoff(row, s) == 2.0f);
    s.top_p = (float)(p3 + 2 * p2 + 1e-3);  // needs the 1.0 too
    CHECK(dllm__row_cutoff(row, s) == 1.0f);
    s.top_p = 1;
    s.min_p = (float)(exp(-1.0) * 0.999);  // p(2.0) / p(3.0) = e^-1: kept, 1.0 (e^-2) not
    CHECK(dllm__row_cutoff(row, s) == 2.0f);
    s.temperature = 2;  // min-p on softmax(l / 2): p(1.0) / p(3.0) = e^-1 now
    CHECK(dllm__row_cutoff(row, s) == 1.0f);
    s.top_k = 1;  // the intersection: the largest cut
    CHECK(dllm__row_cutoff(row, s) == 3.0f);
}

TEST(choose, filters_reach_the_token_and_the_confidence) {
    float logits[5] = {1.0f, 3.0f, 2.5f, -2.0f, 0.5f};
    dllm__sampling s;
    s.temperature = 1.0;
    s.seed = 4;
    s.top_k = 2;
    int counts[5] = {0};
    for (uint32_t pos = 0; pos < 2000; pos++) counts[dllm__choose(logits, 5, s, pos, 1).token]++;
    CHECK_MSG(counts[0] == 0 && counts[3] == 0 && counts[4] == 0 && counts[1] > 1000 && counts[2] > 500, "%d %d %d",
              counts[0], counts[1], counts[2]);
    s.temperature = 0;  // the confidence is the renormalised p over the kept tokens: 1 / (1 + e^-0.5)
    dllm__choice c = dllm__choose(logits, 5, s, 0, 0);
    CHECK_MSG(c.token == 1 && fabs(c.conf - 1 / (1 + exp(-0.5))) < 1e-12, "token %d conf %.17g", c.token, c.conf);
    s.top_k = 0;  // off: bit-for-bit the unfiltered choice
    dllm__sampling plain;
    CHECK(dllm__choose(logits, 5, s, 3, 2).conf == dllm__choose(logits, 5, plain, 3, 2).conf);
}

/* Decoding with a filter that keeps one token samples nothing: at any temperature the result is the one at
 * temperature 0 with that filter (whose confidences are all 1, as Dream computes them on the filtered row). */
TEST(decode, filters_keeping_one_token_sample_nothing) {
    dllm_model *m = test_load(test_data("tiny-llada"));
    dllm_ctx *ctx = m ? test_ctx(m) : nullptr;
    if (!ctx) { CHECK(ctx != nullptr); dllm_model_free(m); return; }
    int32_t prompt[4] = {5, 17, 42, 9}, cold[16], out[16];
    dllm_gen_params p = dllm_gen_default_params();
    p.gen_length = 16; p.steps = 16; p.block_length = 8; p.stop_at_eos = 0;
    p.top_k = 1;
    int n = 0;
    CHECK_STATUS(dllm_generate(ctx, prompt, 4, p, cold, 16, &n, nullptr), DLLM_OK, nullptr);
    p.top_k = 0;
    p.temperature = 5.0f;  // hot: without a filter it wanders
    p.seed = 11;
    CHECK_STATUS(dllm_generate(ctx, prompt, 4, p, out, 16, &n, nullptr), DLLM_OK, nullptr);
    CHECK_MSG(memcmp(out, cold, sizeof out) != 0, "%s", "T = 5 unfiltered matched: the checks below could not fail");
    dllm_gen_params f = p;
    f.top_k = 1;
    CHECK_STATUS(dllm_generate(ctx, prompt, 4, f, out, 16, &n, nullptr), DLLM_OK, nullptr);
    CHECK(memcmp(out, cold, sizeof out) == 0);
    f = p;
    f.min_p = 1.0f;
    CHECK_STATUS(dllm_generate(ctx, prompt, 4, f, out, 16, &n, nullptr), DLLM_OK, nullptr);
    CHECK(memcmp(out, cold, sizeof out) == 0);
    f = p;
    f.top_p = 1e-6f;
    CHECK_STATUS(dllm_generate(ctx, prompt, 4, f, out, 16, &n, nullptr), DLLM_OK, nullptr);
    CHECK(memcmp(out, cold, sizeof out) == 0);
    f = p;
    f.top_k = -1;
    CHECK_STATUS(dllm_generate(ctx, prompt, 4, f, out, 16, &n, nullptr), DLLM_ERR_INVALID_ARGUMENT,
                 "top_k (--top-k) must be >= 0");
    f = p;
    f.top_p = 0;
    CHECK_STATUS(dllm_generate(ctx, prompt, 4, f, out, 16, &n, nullptr), DLLM_ERR_INVALID_ARGUMENT,
                 "top_p (--top-p) must be in (0, 1]");
    f = p;
    f.min_p = NAN;
    CHECK_STATUS(dllm_generate(ctx, prompt, 4, f, out, 16, &n, nullptr), DLLM_ERR_INVALID_ARGUMENT,
                 "min_p (--min-p) must be in [0, 1]");
    dllm_ctx_free(ctx);
    dllm_model_free(m);
}

// ---- the CLI contract (issue 27) --------------------------------------------------------------------

/* Runs `build/PROGRAM ARGS` from the repository root with stdin from `input`; returns the exit status. */
static int test_run_cli(const char *program, const std::string &args, const std::string &input, std::string &out,
                        std::string &err) {
    test_tmpdir dir;
    test_write_file(dir.file("in"), input);
    std::string cmd = std::string("build/") + program + " " + args + " <" + dir.file("in") + " >" + dir.file("out") +
                      " 2>" + dir.file("err");
    int rc = system(cmd.c_str());
    out = test_read_file(dir.file("out"));
    err = test_read_file(dir.file("err"));
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static bool test_cli_built() {
    return dllm__file_exists("build/dllm-generate") && dllm__file_exists("build/dllm-eval") &&
           dllm__file_exists("build/dllm-tokenize");
}

static bool test_one_line(const std::string &err) { return std::count(err.begin(), err.end(), '\n') == 1; }

/* The JSON object dllm-generate --json prints (the last line of stdout). */
static bool test_gen_json(const std::string &out, dllm__json &root) {
    size_t start = out.rfind('\n', out.size() >= 2 ? out.size() - 2 : 0);
    std::string line = out.substr(start == std::string::npos ? 0 : start + 1);
    return dllm__json_parse(line.data(), line.size(), "dllm-generate --json", root) == DLLM_OK &&
           root.kind == dllm__json::OBJ;
}

static const char *test_llada = "-m models/tiny-llada --backend cpu ";

TEST(cli, unknown_options_are_named_in_every_position) {
    if (!test_cli_built()) SKIP("the CLI programs are not built");
    const char *cases[][2] = {{"dllm-generate", "-m models/tiny-llada -p hi --bogus"},
                              {"dllm-generate", "--bogus -m models/tiny-llada -p hi"},
                              {"dllm-eval", "-m models/tiny-llada --nll tests/data/heldout.txt --bogus"},
                              {"dllm-tokenize", "-m models/tiny-llada --bogus"}};
    for (auto &c : cases) {
        std::string out, err;
        int rc = test_run_cli(c[0], c[1], "", out, err);
        CHECK_MSG(rc == 1 && test_one_line(err) && err.find("unknown option --bogus") != std::string::npos,
                  "%s %s: exit %d, stderr %s", c[0], c[1], rc, err.c_str());
    }
    std::string out, err;
    int rc = test_run_cli("dllm-generate", "-m models/tiny-llada -p hi -n", "", out, err);
    CHECK_MSG(rc == 1 && err.find("-n needs a value") != std::string::npos, "exit %d: %s", rc, err.c_str());
    rc = test_run_cli("dllm-generate", "-m models/tiny-llada -p hi stray", "", out, err);
    CHECK_MSG(rc == 1 && err.find("unexpected argument \"stray\"") != std::string::npos, "exit %d: %s", rc,
              err.c_str());
}

TEST(cli, version_flag_prints_the_library_version) {
    if (!test_cli_built()) SKIP("the CLI programs are not built");
    for (const char *program : {"dllm-generate", "dllm-eval", "dllm-tokenize"}) {
        std::string out, err;
        int rc = test_run_cli(program, "--version", "", out, err);
        CHECK_MSG(rc == 0 && out.find(std::string("dllm ") + dllm_version()) != std::string::npos &&
                      out.find(program) == 0,
                  "%s: exit %d, %s", program, rc, out.c_str());
    }
}

TEST(cli, conflicting_options_exit_1_naming_both) {
    if (!test_cli_built()) SKIP("the CLI programs are not built");
    const char *cases[][3] = {{"-p a -p b", "-p", "twice"},
                              {"-p a --prompt b", "-p", "--prompt"},
                              {"-p a --factor 1 --threshold 0.9", "--threshold", "--factor"},
                              {"-p a --timesteps --threshold 0.9", "--threshold", "--timesteps"},
                              {"-p a -f README.md", "-p", "-f"},
                              {"-p a --ids 1", "-p", "--ids"},
                              {"-p a --early-stop --no-early-stop", "--early-stop", "--no-early-stop"},
                              {"-p a --raw --system s", "--raw", "--system"},
                              {"-p a --visual --json", "--visual", "--json"},
                              {"-p a --seed 1 --seed 2", "--seed", "twice"}};
    for (auto &c : cases) {
        std::string out, err;
        int rc = test_run_cli("dllm-generate", std::string(test_llada) + c[0], "", out, err);
        CHECK_MSG(rc == 1 && test_one_line(err) && err.find(c[1]) != std::string::npos &&
                      err.find(c[2]) != std::string::npos,
                  "`%s`: exit %d, stderr %s", c[0], rc, err.c_str());
    }
}

TEST(cli, errors_name_the_flag_to_change) {
    if (!test_cli_built()) SKIP("the CLI programs are not built");
    const char *cases[][2] = {{"-p hi -n 16 --block 5", "--block"},
                              {"-p hi -n 16 --block 8 --steps 3", "--steps 4"},
                              {"-p hi --alg origin --threshold 0.9", "drop --threshold"},
                              {"-p hi --alg origin --factor 2", "drop --factor"},
                              {"-p 'x <|mdm_mask|> y' -n 16 --cache dual", "drop --cache"},
                              {"-p hi --threshold 2", "--threshold must be in (0, 1]"},
                              {"-p hi --alg-temp 0.5 --threshold 0.9", "drop --alg-temp"},
                              {"-p hi --top-p 0", "--top-p"},
                              {"-p hi --min-p 2", "--min-p"},
                              {"-p hi --top-k -3", "--top-k"},
                              {"-p hi --seed -5", "--seed"},
                              {"-f /nonexistent-prompt", "-f /nonexistent-prompt: No such file"},
                              {"-p hi -n 250", "lower -n"}};
    for (auto &c : cases) {
        std::string out, err;
        int rc = test_run_cli("dllm-generate", std::string(test_llada) + c[0], "", out, err);
        CHECK_MSG(rc == 1 && test_one_line(err) && err.find(c[1]) != std::string::npos, "`%s`: exit %d, stderr %s",
                  c[0], rc, err.c_str());
    }
    std::string out, err;
    int rc = test_run_cli("dllm-generate", "-m /nonexistent-model -p hi", "", out, err);
    CHECK_MSG(rc == 1 && err.find("/nonexistent-model: No such file or directory") != std::string::npos, "exit %d: %s",
              rc, err.c_str());
    std::string why;
    if (!dllm__gpu_usable(0, why)) {  // without a GPU, --backend gpu says how to run anyway
        rc = test_run_cli("dllm-generate", "-m models/tiny-llada -p hi --backend gpu", "", out, err);
        CHECK_MSG(rc == 1 && test_one_line(err) && err.find("drop --backend gpu") != std::string::npos, "exit %d: %s",
                  rc, err.c_str());
    }
}

/* -n alone works: block and steps follow it; early stop (on by default) saves forwards without changing the
 * answer; --no-early-stop decodes every block. */
TEST(cli, defaults_follow_n_and_early_stop_changes_nothing_shown) {
    if (!test_cli_built()) SKIP("the CLI programs are not built");
    std::string out, err, out2, err2;
    int rc = test_run_cli("dllm-generate", std::string(test_llada) + "-p hi -n 16 --json", "", out, err);
    dllm__json a, b;
    CHECK_MSG(rc == 0 && test_gen_json(out, a), "exit %d: %s", rc, err.c_str());
    if (rc) return;
    CHECK(a.find("stats")->find("steps")->integer <= 16);
    rc = test_run_cli("dllm-generate", std::string(test_llada) + "-p hi -n 64 --json", "", out, err);
    int rc2 =
        test_run_cli("dllm-generate", std::string(test_llada) + "-p hi -n 64 --json --no-early-stop", "", out2, err2);
    CHECK_MSG(rc == 0 && rc2 == 0 && test_gen_json(out, a) && test_gen_json(out2, b), "exit %d %d: %s %s", rc, rc2,
              err.c_str(), err2.c_str());
    if (rc || rc2) return;
    long fa = a.find("stats")->find("forwards")->integer, fb = b.find("stats")->find("forwards")->integer;
    CHECK_MSG(fb == 64 && fa < fb,
              "forwards with early stop %ld, without %ld (the prompt's answer ends in the first block)", fa, fb);
    CHECK(a.find("text")->str == b.find("text")->str && !a.find("text")->str.empty());
}

TEST(cli, sampling_draws_a_fresh_seed_and_prints_it) {
    if (!test_cli_built()) SKIP("the CLI programs are not built");
    auto seed_of = [](const std::string &err) {
        size_t at = err.find(", seed ");
        return at == std::string::npos ? std::string("?")
                                       : err.substr(at + 7, err.find_first_not_of("0123456789", at + 7) - at - 7);
    };
    std::string out1, err1, out2, err2, out3, err3;
    const std::string args = std::string(test_llada) + "-p 'Tell me a story' -n 32 --temp 1.5";
    CHECK(test_run_cli("dllm-generate", args, "", out1, err1) == 0);
    CHECK(test_run_cli("dllm-generate", args + " --seed -1", "", out2, err2) == 0);
    CHECK_MSG(seed_of(err1) != "?" && seed_of(err1) != seed_of(err2), "seeds %s and %s", seed_of(err1).c_str(),
              seed_of(err2).c_str());
    CHECK(test_run_cli("dllm-generate", args + " --seed " + seed_of(err1), "", out3, err3) == 0);
    CHECK_MSG(out3 == out1 && seed_of(err3) == seed_of(err1), "the printed seed does not repeat the run:\n%s\n%s",
              out1.c_str(), out3.c_str());
    CHECK(test_run_cli("dllm-generate", std::string(test_llada) + "-p hi -n 16", "", out1, err1) == 0 &&
          seed_of(err1) == "0");  // greedy: nothing drawn
}

TEST(cli, ids_prompt_prints_text_when_the_model_has_a_tokenizer) {
    if (!test_cli_built()) SKIP("the CLI programs are not built");
    std::string out, err;
    int rc = test_run_cli("dllm-generate", std::string(test_llada) + "--ids '316 998' -n 32 --steps 32 --block 8", "",
                          out, err);
    CHECK_MSG(rc == 0 && out.size() > 2 && out.find("ids:") == std::string::npos, "exit %d, stdout \"%s\"", rc,
              out.c_str());
    rc = test_run_cli("dllm-generate", "-m tests/data/tiny-llada --backend cpu --ids '5 17' -n 8", "", out,
                      err);  // no tokenizer: ids
    CHECK_MSG(rc == 0 && out.rfind("ids:", 0) == 0, "exit %d, stdout \"%s\"", rc, out.c_str());
}

TEST(cli, prompt_from_file_and_stdin_equals_the_argument) {
    if (!test_cli_built()) SKIP("the CLI programs are not built");
    test_tmpdir dir;
    test_write_file(dir.file("prompt"), "Tell me a story\n");  // one trailing newline is dropped, as llama.cpp does
    std::string out1, out2, out3, err;
    const std::string base = std::string(test_llada) + "-n 16 ";
    CHECK(test_run_cli("dllm-generate", base + "-p 'Tell me a story'", "", out1, err) == 0);
    CHECK(test_run_cli("dllm-generate", base + "-f " + dir.file("prompt"), "", out2, err) == 0);
    CHECK(test_run_cli("dllm-generate", base + "-p -", "Tell me a story\n", out3, err) == 0);
    CHECK_MSG(!out1.empty() && out1 == out2 && out1 == out3, "-p:\n%s\n-f:\n%s\n-p -:\n%s", out1.c_str(), out2.c_str(),
              out3.c_str());
}

TEST(cli, json_holds_text_ids_and_stats) {
    if (!test_cli_built()) SKIP("the CLI programs are not built");
    std::string out, err;
    int rc = test_run_cli("dllm-generate", std::string(test_llada) + "-p 'Tell me a story' -n 32 --json", "", out, err);
    dllm__json j;
    CHECK_MSG(rc == 0 && test_gen_json(out, j) && std::count(out.begin(), out.end(), '\n') == 1, "exit %d, stdout %s",
              rc, out.c_str());
    if (rc) return;
    const dllm__json *ids = j.find("ids"), *text = j.find("text"), *stats = j.find("stats");
    CHECK(ids && text && stats && stats->find("forwards") && stats->find("seed") && stats->find("n_generated"));
    if (!ids || !text) return;
    dllm_tokenizer *tok = nullptr;
    CHECK_STATUS(dllm_tokenizer_load("models/tiny-llada", &tok), DLLM_OK, nullptr);
    std::vector<int32_t> v;
    for (const dllm__json &x : ids->items) v.push_back((int32_t)x.integer);
    char buf[4096];
    size_t len = 0;
    CHECK_STATUS(dllm_detokenize(tok, v.data(), (int)v.size(), 1, buf, sizeof buf, &len), DLLM_OK, nullptr);
    CHECK_MSG(text->str == buf, "text \"%s\", its ids decode to \"%s\"", text->str.c_str(), buf);
    dllm_tokenizer_free(tok);
}

TEST(cli, stop_string_ends_the_answer_and_the_decoding) {
    if (!test_cli_built()) SKIP("the CLI programs are not built");
    std::string out, err, full, err2;
    const std::string base = std::string(test_llada) + "-p 'Tell me a story' -n 32 --json";
    CHECK(test_run_cli("dllm-generate", base, "", full, err2) == 0);
    dllm__json a, b;
    if (!test_gen_json(full, a)) { CHECK(false); return; }
    const std::string whole = a.find("text")->str;
    size_t nl = whole.find('\n');  // stop at the answer's first newline: the text before it remains
    if (nl == std::string::npos || nl == 0) SKIP("the tiny model's answer has no inner newline");
    int rc = test_run_cli("dllm-generate", base + " --stop '\n'", "", out, err);
    CHECK_MSG(rc == 0 && test_gen_json(out, b), "exit %d: %s", rc, err.c_str());
    if (rc) return;
    CHECK_MSG(b.find("text")->str == whole.substr(0, nl), "text \"%s\", want \"%s\"", b.find("text")->str.c_str(),
              whole.substr(0, nl).c_str());
    CHECK(b.find("stats")->find("forwards")->integer < a.find("stats")->find("forwards")->integer);
    CHECK(err.find("ended at a stop string") != std::string::npos);
    // streamed (not --json): the same text, and nothing of the stop string on stdout
    rc =
        test_run_cli("dllm-generate", std::string(test_llada) + "-p 'Tell me a story' -n 32 --stop '\n'", "", out, err);
    CHECK_MSG(rc == 0 && out == whole.substr(0, nl) + "\n", "exit %d, stdout \"%s\"", rc, out.c_str());
}

TEST(cli, interactive_chat_answers_each_line) {
    if (!test_cli_built()) SKIP("the CLI programs are not built");
    std::string out, err;
    int rc = test_run_cli("dllm-generate", std::string(test_llada) + "-i --system 'Be brief.' -n 16 --json",
                          "Hello\n\nTell me more\n", out, err);
    CHECK_MSG(rc == 0 && std::count(out.begin(), out.end(), '\n') == 2 && std::count(err.begin(), err.end(), '\n') == 2,
              "exit %d\n%s\n%s", rc, out.c_str(), err.c_str());
    size_t second = out.find('\n') + 1;
    dllm__json t1, t2;
    CHECK(dllm__json_parse(out.data(), second - 1, "turn 1", t1) == DLLM_OK &&
          dllm__json_parse(out.data() + second, out.size() - second, "turn 2", t2) == DLLM_OK);
    // the second turn's prompt holds the first exchange: it is longer than the first turn's
    if (t1.find("stats") && t2.find("stats"))
        CHECK(t2.find("stats")->find("n_prompt")->integer > t1.find("stats")->find("n_prompt")->integer + 5);
}

TEST(cli, no_parse_special_keeps_typed_special_tokens_as_text) {
    if (!test_cli_built()) SKIP("the CLI programs are not built");
    std::string out, err, out2, err2;
    // typed as text, the mask token is plain characters, so the K/V cache may decode the prompt
    int rc = test_run_cli(
        "dllm-generate", std::string(test_llada) + "-p 'x <|mdm_mask|> y' -n 16 --cache dual --no-parse-special --json",
        "", out, err);
    CHECK_MSG(rc == 0, "exit %d: %s", rc, err.c_str());
    // without special tokens in the text, --no-parse-special changes nothing (the template's tokens stay special)
    rc = test_run_cli("dllm-generate", std::string(test_llada) + "-p 'Tell me a story' -n 16 --json --system sys", "",
                      out, err);
    int rc2 = test_run_cli(
        "dllm-generate", std::string(test_llada) + "-p 'Tell me a story' -n 16 --json --system sys --no-parse-special",
        "", out2, err2);
    dllm__json a, b;
    CHECK(rc == 0 && rc2 == 0 && test_gen_json(out, a) && test_gen_json(out2, b));
    if (a.find("stats") && b.find("stats")) {
        CHECK(a.find("stats")->find("n_prompt")->integer == b.find("stats")->find("n_prompt")->integer);
        CHECK(a.find("text")->str == b.find("text")->str);
    }
}

TEST(cli, top_k_one_samples_the_same_answer_every_time) {
    if (!test_cli_built()) SKIP("the CLI programs are not built");
    std::string out1, out2, err;
    const std::string args = std::string(test_llada) + "-p 'Tell me a story' -n 16 --temp 3 --top-k 1";
    CHECK(test_run_cli("dllm-generate", args, "", out1, err) == 0);
    CHECK(test_run_cli("dllm-generate", args, "", out2, err) == 0);  // a fresh seed each run
    CHECK_MSG(!out1.empty() && out1 == out2, "%s\n%s", out1.c_str(), out2.c_str());
}

TEST(cli, progress_without_a_terminal_is_one_line_a_block) {
    if (!test_cli_built()) SKIP("the CLI programs are not built");
    std::string out, err, plain, err2;
    CHECK(test_run_cli("dllm-generate", std::string(test_llada) + "-p hi -n 32 --block 8 --no-early-stop --progress",
                       "", out, err) == 0);
    CHECK(test_run_cli("dllm-generate", std::string(test_llada) + "-p hi -n 32 --block 8 --no-early-stop", "", plain,
                       err2) == 0);
    CHECK_MSG(out == plain && err.find('\r') == std::string::npos && std::count(err.begin(), err.end(), '\n') == 5,
              "stderr:\n%s", err.c_str());
}

TEST(cli, eval_reports_reasons_and_line_numbers) {
    if (!test_cli_built()) SKIP("the CLI programs are not built");
    std::string out, err;
    int rc = test_run_cli("dllm-eval", "-m models/tiny-llada --nll /nonexistent-file", "", out, err);
    CHECK_MSG(rc == 1 && test_one_line(err) &&
                  err.find("--nll /nonexistent-file: No such file or directory") != std::string::npos,
              "exit %d: %s", rc, err.c_str());
    test_tmpdir dir;
    test_write_file(dir.file("add"), "1+2=3\n\n12+30=42\nnot a problem\n");
    rc = test_run_cli("dllm-eval", "-m models/tiny-add --backend cpu --add " + dir.file("add"), "", out, err);
    CHECK_MSG(rc == 1 && test_one_line(err) &&
                  err.find(dir.file("add") + ":4: expected a line \"a+b=sum\"") != std::string::npos,
              "exit %d: %s", rc, err.c_str());
    rc = test_run_cli("dllm-eval", "-m models/tiny-llada --agree tests/data/prompts.txt --steps 3", "", out, err);
    CHECK_MSG(rc == 1 && test_one_line(err) && err.find("--steps 3") != std::string::npos, "exit %d: %s", rc,
              err.c_str());
    rc = test_run_cli("dllm-eval", "-m models/tiny-add --backend cpu --add tests/data/add_test.txt --limit 3", "", out,
                      err);
    CHECK_MSG(rc == 0 && out.find("add_problems 3\n") != std::string::npos && err.empty(), "exit %d: %s %s", rc,
              out.c_str(), err.c_str());
}

TEST(cli, tokenize_decode_keeps_one_line_per_input_line) {
    if (!test_cli_built()) SKIP("the CLI programs are not built");
    std::string ids, err, text;
    const std::string input = "first\\line\nsecond\n";
    CHECK(test_run_cli("dllm-tokenize", "-m models/tiny-llada", input, ids, err) == 0);
    // a newline inside the text of one line of ids: "a\nb"
    CHECK(test_run_cli("dllm-tokenize", "-m models/tiny-llada", "a\n", text, err) == 0);
    std::string nl_ids, a_ids = text.substr(0, text.size() - 1);
    CHECK(test_run_cli("dllm-tokenize", "-m models/tiny-llada --decode", ids + a_ids + " 198 " + a_ids + "\n", text,
                       err) == 0);
    CHECK_MSG(text == "first\\\\line\nsecond\na\\na\n", "decoded:\n%s", text.c_str());
    CHECK(std::count(text.begin(), text.end(), '\n') == 3);
    CHECK(test_run_cli("dllm-tokenize", "-m models/tiny-llada --decode --raw-newlines", a_ids + " 198 " + a_ids + "\n",
                       text, err) == 0 &&
          text == "a\na\n");
}

TEST(cli, new_user_commands_succeed_or_name_the_flag) {
    if (!test_cli_built()) SKIP("the CLI programs are not built");
    test_tmpdir dir;
    int rc = system(("sh tests/cli_newuser.sh >" + dir.file("log") + " 2>&1").c_str());
    std::string log = test_read_file(dir.file("log"));
    CHECK_MSG(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "tests/cli_newuser.sh:\n%s", log.c_str());
}

/* On a terminal (a pseudo-terminal from util-linux `script`), the progress line is redrawn in place, then
 * erased, and the answer follows whole: nothing overwrites it. */
TEST(cli, progress_on_a_terminal_leaves_the_answer_whole) {
    if (!test_cli_built()) SKIP("the CLI programs are not built");
    if (system("command -v script >/dev/null 2>&1") != 0) SKIP("no `script` to make a terminal");
    const std::string args = std::string(test_llada) + "-p hi -n 32 --block 8 --no-early-stop";
    std::string plain, err;
    CHECK(test_run_cli("dllm-generate", args, "", plain, err) == 0);
    test_tmpdir dir;
    std::string cmd = "script -qec \"build/dllm-generate " + args + " --progress\" /dev/null >" + dir.file("tty") +
                      " 2>&1 </dev/null";
    int rc = system(cmd.c_str());
    std::string tty = test_read_file(dir.file("tty"));
    size_t last_clear = tty.rfind("\r\033[K");
    CHECK_MSG(WIFEXITED(rc) && WEXITSTATUS(rc) == 0 && last_clear != std::string::npos &&
                  tty.find("step 32/32") != std::string::npos,
              "exit %d: %s", rc, tty.c_str());
    if (last_clear == std::string::npos) return;
    std::string after = tty.substr(last_clear + 4), answer;
    for (size_t i = 0; i + 1 < plain.size(); i++)
        answer += plain[i] == '\n' ? std::string("\r\n") : std::string(1, plain[i]);  // a terminal's newlines
    CHECK_MSG(after.compare(0, answer.size() + 2, answer + "\r\n") == 0 &&
                  after.find("generated ") == answer.size() + 2,
              "after the progress: \"%s\", answer \"%s\"", after.c_str(), answer.c_str());
}

/* build/libdllm.so exports the dllm_ names only, and a C program built with its pkg-config flags runs. */
TEST(cli, shared_library_exports_dllm_names_and_links_from_c) {
    if (!dllm__file_exists("build/libdllm.so") || !dllm__file_exists("build/dllm.pc"))
        SKIP("build/libdllm.so not built");
    test_tmpdir dir;
    int rc =
        system(("nm -D --defined-only build/libdllm.so | awk '{print $3}' | grep -v '^dllm_' >" + dir.file("foreign"))
                   .c_str());
    std::string foreign = test_read_file(dir.file("foreign"));
    CHECK_MSG(WIFEXITED(rc) && foreign.empty(), "exported beyond dllm_: %.300s", foreign.c_str());
    if (system("command -v gcc >/dev/null 2>&1 && command -v pkg-config >/dev/null 2>&1") != 0)
        SKIP("no gcc or pkg-config to link a C program");
    test_write_file(
        dir.file("app.c"),
        "#include <dllm.h>\n#include <stdio.h>\nint main(void) { printf(\"%s\\n\", dllm_version()); return 0; }\n");
    std::string cmd = "PKG_CONFIG_PATH=build gcc -std=c99 -o " + dir.file("app") + " " + dir.file("app.c") +
                      " $(PKG_CONFIG_PATH=build pkg-config --cflags --libs dllm) && "
                      "LD_LIBRARY_PATH=build " +
                      dir.file("app") + " >" + dir.file("out") + " 2>&1";
    rc = system(cmd.c_str());
    std::string out = test_read_file(dir.file("out"));
    CHECK_MSG(WIFEXITED(rc) && WEXITSTATUS(rc) == 0 && out == std::string(dllm_version()) + "\n", "exit %d: %s", rc,
              out.c_str());
}

/* dllm-quantize writes a directory that dllm-generate loads with its stored precision as the default, and answers
 * exactly as quantising at load does; its errors name the flag to change. */
TEST(cli, quantize_once_then_generate_the_same_answer) {
    if (!test_cli_built() || !dllm__file_exists("build/dllm-quantize")) SKIP("the CLI programs are not built");
    test_tmpdir dir;
    const std::string out = dir.path + "/q";
    std::string so, se, ao, ae, bo, be;
    int rc = test_run_cli("dllm-quantize", "-m models/tiny-llada -o " + out + " --precision soloq-i --threads 2", "",
                          so, se);
    CHECK_MSG(rc == 0 && se.find("layer 1/") != std::string::npos && se.find("wrote " + out) != std::string::npos,
              "exit %d: %s", rc, se.c_str());
    if (rc) return;
    int rc_a = test_run_cli("dllm-generate", "-m " + out + " --backend cpu -p hi -n 16 --json", "", ao, ae);
    int rc_b =
        test_run_cli("dllm-generate", std::string(test_llada) + "--precision soloq-i -p hi -n 16 --json", "", bo, be);
    dllm__json a, b;
    CHECK_MSG(rc_a == 0 && rc_b == 0 && test_gen_json(ao, a) && test_gen_json(bo, b), "exit %d %d: %s %s", rc_a, rc_b,
              ae.c_str(), be.c_str());
    if (rc_a || rc_b) return;
    CHECK(a.find("ids") && b.find("ids") && a.find("text")->str == b.find("text")->str);
    CHECK(a.find("ids")->items.size() == b.find("ids")->items.size());
    for (size_t i = 0; i < a.find("ids")->items.size() && i < b.find("ids")->items.size(); i++)
        CHECK(a.find("ids")->items[i].integer == b.find("ids")->items[i].integer);
    rc = test_run_cli("dllm-generate", "-m " + out + " --backend cpu --precision soloq-n -p hi -n 16", "", ao, ae);
    CHECK_MSG(rc == 1 && test_one_line(ae) &&
                  ae.find("--precision soloq-n cannot run them; use --precision soloq-i") != std::string::npos,
              "exit %d: %s", rc, ae.c_str());
    const char *cases[][2] = {{"-m models/tiny-llada -o OUT --precision soloq-i", "--force"},
                              {"-m models/tiny-llada -o OUT", "--precision is required"},
                              {"-m models/tiny-llada -o OUT --precision fp8", "--precision must be"},
                              {"-m models/tiny-llada --precision soloq-i", "-o OUT_DIR"},
                              {"-m /nonexistent-model -o OUT2 --precision soloq-i", "/nonexistent-model: No such file"},
                              {"-m models/tiny-llada -o OUT --threads x --precision soloq-i", "--threads"}};
    for (auto &c : cases) {
        std::string args = c[0];
        for (size_t at; (at = args.find("OUT")) != std::string::npos;) args.replace(at, 3, out);
        rc = test_run_cli("dllm-quantize", args, "", so, se);
        CHECK_MSG(rc == 1 && test_one_line(se) && se.find(c[1]) != std::string::npos, "`%s`: exit %d, stderr %s", c[0],
                  rc, se.c_str());
    }
    rc = test_run_cli("dllm-quantize", "--help", "", so, se);
    CHECK(rc == 0 && so.find("--quantize-lm-head") != std::string::npos && so.find("--force") != std::string::npos);
    rc = test_run_cli("dllm-quantize", "-m models/tiny-llada -o " + out + " --precision soloq-i --force --quiet", "",
                      so, se);
    CHECK_MSG(rc == 0 && se.empty(), "exit %d: %s", rc, se.c_str());
    for (const char *f : {"config.json", "generation_config.json", "model.safetensors", "special_tokens_map.json",
                          "tokenizer.json", "tokenizer_config.json"})
        unlink((out + "/" + f).c_str());
    rmdir(out.c_str());
}

/* LLaDA2 in the quantised precisions through the three programs on the CPU: dllm-quantize writes tiny-llada2 as
 * SoloQ-C, dllm-generate answers from it (32 tokens, one block) as from quantising at load, dllm-eval --nll measures
 * FP8 and SoloQ-I (each moving the NLL from BF16's; the values themselves belong to BENCHMARKS.md, not to a test of a
 * model that may be retrained). */
TEST(cli, llada2_quantised_precisions_on_the_cpu) {
    if (!test_cli_built() || !dllm__file_exists("build/dllm-quantize")) SKIP("the CLI programs are not built");
    test_tmpdir dir;
    const std::string out = dir.path + "/q";
    std::string so, se, ao, ae, bo, be;
    int rc = test_run_cli("dllm-quantize",
                          "-m models/tiny-llada2 -o " + out + " --precision soloq-c --threads 2 --quiet", "", so, se);
    CHECK_MSG(rc == 0, "exit %d: %s", rc, se.c_str());
    if (rc) return;
    const std::string gen = " --backend cpu --threads 2 --raw -p \"Life is\" -n 32 --json";
    const int rc_a = test_run_cli("dllm-generate", "-m " + out + gen, "", ao, ae),
              rc_b = test_run_cli("dllm-generate", "-m models/tiny-llada2 --precision soloq-c" + gen, "", bo, be);
    dllm__json a, b;
    CHECK_MSG(rc_a == 0 && rc_b == 0 && test_gen_json(ao, a) && test_gen_json(bo, b), "exit %d %d: %s %s", rc_a, rc_b,
              ae.c_str(), be.c_str());
    if (!rc_a && !rc_b && a.find("ids") && b.find("ids")) {
        CHECK(!a.find("ids")->items.empty() && a.find("ids")->items.size() == b.find("ids")->items.size());
        for (size_t i = 0; i < a.find("ids")->items.size() && i < b.find("ids")->items.size(); i++)
            CHECK(a.find("ids")->items[i].integer == b.find("ids")->items[i].integer);
    }
    std::map<std::string, double> nll[3];
    const char *precisions[3] = {"bf16", "fp8", "soloq-i"};
    for (int i = 0; i < 3; i++) {
        const std::string args = std::string("-m models/tiny-llada2 --nll tests/data/heldout.txt --windows 4 ") +
                                 "--backend cpu --precision " + precisions[i];
        CHECK(test_eval(args, nll[i]) == 0);
        printf("    tiny-llada2 %-7s NLL at 0.5 over 4 windows: %.6f\n", precisions[i], nll[i]["nll_0.50"]);
    }
    for (int i = 1; i < 3; i++) {
        const double got = nll[i]["nll_0.50"], bf16 = nll[0]["nll_0.50"];
        CHECK_MSG(std::isfinite(got) && got > 0 && got != bf16 &&
                      nll[i]["nll_0.50_masked"] == nll[0]["nll_0.50_masked"],
                  "%s: NLL %.6f, bf16 %.6f", precisions[i], got, bf16);
    }
    for (const char *f : {"config.json", "generation_config.json", "model.safetensors", "special_tokens_map.json",
                          "tokenizer.json", "tokenizer_config.json"})
        unlink((out + "/" + f).c_str());
    rmdir(out.c_str());
}

/* The ids lines of a dllm-generate stdout, in order. */
static std::vector<std::string> test_ids_lines(const std::string &out) {
    std::vector<std::string> lines;
    size_t at = 0;
    while ((at = out.find("ids:", at)) != std::string::npos) {
        size_t end = out.find('\n', at);
        lines.push_back(out.substr(at, end - at));
        at = end;
    }
    return lines;
}

/* --prompts FILE --batch N: every prompt's ids line, in input order, is the one -p gives that prompt alone,
 * whatever N; a bad --batch and --prompts with a streaming option exit 1 naming the flags. */
TEST(cli, prompts_file_decodes_each_line_as_p_would) {
    if (!test_cli_built()) SKIP("the CLI programs are not built");
    const char *prompts[] = {"Tell me a story.", "hi", "What is two plus two? Answer briefly, please.",
                             "Why is the sky blue?", "ok"};
    const std::string opts =
        std::string(test_llada) + "-n 16 --block 8 --steps 8 --threshold 0.5 --cfg 0.5 --print-ids ";
    test_tmpdir dir;
    std::string file, out, err;
    std::vector<std::string> alone;
    for (const char *p : prompts) {
        file += std::string(p) + "\n\n";  // empty lines are skipped
        int rc = test_run_cli("dllm-generate", opts + "-p \"" + p + "\"", "", out, err);
        std::vector<std::string> ids = test_ids_lines(out);
        CHECK_MSG(rc == 0 && ids.size() == 1, "-p %s: exit %d, %s", p, rc, err.c_str());
        alone.push_back(ids.empty() ? "" : ids[0]);
    }
    test_write_file(dir.file("prompts"), file);
    for (const char *batch : {"2", "8"}) {
        int rc = test_run_cli("dllm-generate", opts + "--prompts " + dir.file("prompts") + " --batch " + batch, "", out,
                              err);
        CHECK_MSG(rc == 0 && test_ids_lines(out) == alone, "--batch %s: exit %d, stdout %s, stderr %s", batch, rc,
                  out.c_str(), err.c_str());
        CHECK_MSG(out.find("[0] ") == 0 && out.find("[4] ") != std::string::npos,
                  "--batch %s: answers not numbered: %s", batch, out.c_str());
        CHECK_MSG(err.find("batched steps") != std::string::npos, "--batch %s: no stats line: %s", batch, err.c_str());
    }
    int rc = test_run_cli("dllm-generate", std::string(test_llada) + "-p hi --batch 2", "", out, err);
    CHECK_MSG(rc == 1 && err.find("--batch") != std::string::npos && err.find("--prompts") != std::string::npos,
              "exit %d: %s", rc, err.c_str());
    const std::string json_opts =
        std::string(test_llada) + "-n 16 --block 8 --steps 8 --threshold 0.5 --cfg 0.5 --json ";
    rc = test_run_cli("dllm-generate", json_opts + "--prompts " + dir.file("prompts"), "", out,
                      err);  // an object a line
    CHECK_MSG(rc == 0 && std::count(out.begin(), out.end(), '\n') == (long)alone.size() &&
                  out.rfind("{\"index\": 0", 0) == 0 &&
                  out.find("{\"index\": " + std::to_string(alone.size() - 1)) != std::string::npos,
              "--prompts --json: exit %d, stdout %s, stderr %s", rc, out.c_str(), err.c_str());
    rc = test_run_cli("dllm-generate", std::string(test_llada) + "--prompts " + dir.file("prompts") + " --batch 0", "",
                      out, err);
    CHECK_MSG(rc == 1 && err.find("--batch must be a positive count") != std::string::npos, "exit %d: %s", rc,
              err.c_str());
    rc = test_run_cli("dllm-generate", std::string(test_llada) + "--prompts " + dir.file("missing"), "", out, err);
    CHECK_MSG(rc == 1 && test_one_line(err) && err.find("--prompts") != std::string::npos, "exit %d: %s", rc,
              err.c_str());
}
