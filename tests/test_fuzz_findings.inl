/* Regressions for what the fuzzers found (BENCHMARKS.md, "fuzzing and the tokenizer differential"). */

/* tools/tokenizer_diff.py: 8 of 1,000,000 random inputs got other Qwen2.5 ids than Hugging Face's, each
 * holding a letter that Unicode 16.0 added; dllm's tables were Unicode 15.0, tokenizers 0.23's Oniguruma is
 * 16.0. The splits below are Hugging Face's (pre_tokenizers.Split of the Qwen2 pattern, tokenizers 0.23.3). */
TEST(tokenizer, unicode_16_letters_split_as_hugging_face) {
    CHECK(dllm__is_letter(0x13982) && dllm__is_letter(0x11389) &&
          dllm__is_letter(0x14092));  // Egyptian Ext-A, Tulu-Tigalari
    CHECK(!dllm__is_letter(0x10940) && !dllm__is_letter(0x11DB0));                            // Unicode 17.0: not yet
    CHECK(test_split(DLLM__PRETOK_QWEN2, "!\xF0\x93\xA6\x82!") == "!\xF0\x93\xA6\x82|!");       // U+13982
    CHECK(test_split(DLLM__PRETOK_QWEN2, "!\xF0\x91\x8E\x89!") == "!\xF0\x91\x8E\x89|!");       // U+11389
    CHECK(test_split(DLLM__PRETOK_QWEN2, "!\xF0\x90\xA5\x80!") == "!\xF0\x90\xA5\x80!");        // U+10940 (17.0)
    // The input the differential found, cut down: U+14092 before 's makes 's a contraction.
    CHECK(test_split(DLLM__PRETOK_QWEN2, "<|im_\xF0\x94\x82\x92's") == "<||im|_\xF0\x94\x82\x92|'s");
}
