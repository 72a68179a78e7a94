/* dllm-tokenize: text to token ids and back with a model's Hugging Face tokenizer.
 *
 *   printf 'Hello world\n' | build/dllm-tokenize -m ../shared/models/fast-dllm-v2-7b      ->  9707 1879
 *   echo "9707 1879" | build/dllm-tokenize -m ../shared/models/fast-dllm-v2-7b --decode   ->  Hello world
 *
 * The contract other tools rely on: stdin is split on '\n' only (a '\r' stays in its line); each input
 * line gives one output line, the ids separated by single spaces (an empty line for empty input), with
 * special-token text recognised as Hugging Face does by default and no BOS/EOS added. --decode reverses
 * it: each line of ids gives one line of text, with a backslash, newline and carriage return in the text
 * written as \\, \n and \r, so that the output has as many lines as the input (--raw-newlines writes
 * them as they are). Exit status 0 on success, 1 with a one-line message.
 * Written in C99 against dllm.h only.
 */
#include "../dllm.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: dllm-tokenize -m DIR [--decode] [options] < input\n"
            "\n"
            "Reads UTF-8 text on stdin and prints, for each line, its token ids separated by spaces.\n"
            "\n"
            "  -m, --model DIR        directory with tokenizer.json, or vocab.json + merges.txt + tokenizer_config.json\n"
            "  --decode               the reverse: each line of ids becomes one line of text, with \\, newline and\n"
            "                         carriage return written as \\\\, \\n and \\r (one output line per input line)\n"
            "  --raw-newlines         with --decode, write the text's newlines and backslashes as they are\n"
            "  --no-parse-special     encode special-token text (e.g. <|im_end|>) as plain text\n"
            "  --skip-special         with --decode, leave special tokens out of the text\n"
            "  --version              print the version\n"
            "  -h, --help             this text\n");
}

static int fail(const char *what, const char *detail) {
    fprintf(stderr, "dllm-tokenize: %s%s\n", what, detail);
    return 1;
}

/* All of stdin in a malloc'ed buffer; NULL on failure. */
static char *read_stdin(size_t *len) {
    size_t cap = 1 << 16, n = 0, got;
    char *buf = (char *)malloc(cap);
    while (buf && (got = fread(buf + n, 1, cap - n, stdin)) > 0) {
        n += got;
        if (n == cap) {
            char *grown = (char *)realloc(buf, cap *= 2);
            if (!grown) { free(buf); return NULL; }
            buf = grown;
        }
    }
    if (buf && ferror(stdin)) { free(buf); return NULL; }
    *len = n;
    return buf;
}

/* "dllm-tokenize: line N: " and a message on stderr, one line; returns 1. */
#if defined(__GNUC__)
static int fail_line(long line_no, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#endif
static int fail_line(long line_no, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "dllm-tokenize: line %ld: ", line_no);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    return 1;
}

static int encode_line(const dllm_tokenizer *tok, long line_no, const char *line, size_t len, int parse_special, int32_t **ids, int *cap) {
    int n = 0, i;
    dllm_status s = dllm_tokenize(tok, line, len, parse_special, *ids, *cap, &n);
    if (s == DLLM_ERR_BUFFER_TOO_SMALL) {
        int32_t *grown = (int32_t *)realloc(*ids, sizeof(int32_t) * (size_t)n);
        if (!grown) return fail("out of memory", "");
        *ids = grown;
        *cap = n;
        s = dllm_tokenize(tok, line, len, parse_special, *ids, *cap, &n);
    }
    if (s != DLLM_OK) return fail_line(line_no, "%s", dllm_last_error());
    for (i = 0; i < n; i++) printf(i ? " %d" : "%d", (*ids)[i]);
    printf("\n");
    return 0;
}

/* text[0..len) with '\\', '\n' and '\r' escaped (escape = 1) or as it is. */
static void write_text(const char *text, size_t len, int escape) {
    size_t i;
    if (!escape) { fwrite(text, 1, len, stdout); return; }
    for (i = 0; i < len; i++) {
        if (text[i] == '\\') fputs("\\\\", stdout);
        else if (text[i] == '\n') fputs("\\n", stdout);
        else if (text[i] == '\r') fputs("\\r", stdout);
        else putchar(text[i]);
    }
}


static int decode_line(const dllm_tokenizer *tok, long line_no, const char *line, size_t len, int skip_special, int escape, int32_t **ids, int *cap,
                       char **text, size_t *text_cap) {
    int n = 0, n_vocab = dllm_tokenizer_n_vocab(tok);
    size_t need = 0;
    const char *p = line, *end = line + len;
    dllm_status s;
    while (p < end) {
        char *after;
        long v;
        size_t word;
        while (p < end && (*p == ' ' || *p == '\t' || *p == '\r')) p++;
        if (p == end) break;
        for (word = 0; p + word < end && p[word] != ' ' && p[word] != '\t' && p[word] != '\r'; word++) {}
        v = strtol(p, &after, 10);
        if (after != p + word || v < 0 || v > INT32_MAX) {
            char shown[48];
            snprintf(shown, sizeof shown, "%.*s%s", word > 40 ? 40 : (int)word, p, word > 40 ? "..." : "");
            return fail_line(line_no, "bad id \"%s\": expected token ids (integers >= 0) separated by spaces", shown);
        }
        if (v >= n_vocab) return fail_line(line_no, "id %ld is outside the tokenizer's vocabulary [0, %d)", v, n_vocab);
        if (n == *cap) {
            int32_t *grown = (int32_t *)realloc(*ids, sizeof(int32_t) * (size_t)(*cap = *cap * 2 + 16));
            if (!grown) return fail("out of memory", "");
            *ids = grown;
        }
        (*ids)[n++] = (int32_t)v;
        p = after;
    }
    s = dllm_detokenize(tok, *ids, n, skip_special, *text, *text_cap, &need);
    if (s == DLLM_ERR_BUFFER_TOO_SMALL) {
        char *grown = (char *)realloc(*text, need);
        if (!grown) return fail("out of memory", "");
        *text = grown;
        *text_cap = need;
        s = dllm_detokenize(tok, *ids, n, skip_special, *text, *text_cap, &need);
    }
    if (s != DLLM_OK) return fail_line(line_no, "%s", dllm_last_error());
    write_text(*text, need - 1, escape);
    printf("\n");
    return 0;
}

int main(int argc, char **argv) {
    const char *dir = NULL;
    int decode = 0, parse_special = 1, skip_special = 0, escape = 1, cap = 0, rc = 0, i;
    dllm_tokenizer *tok = NULL;
    int32_t *ids = NULL;
    char *input, *text = NULL;
    size_t len = 0, pos = 0, text_cap = 0;
    long line_no = 0;

    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) { usage(stdout); return 0; }
        else if (!strcmp(argv[i], "--decode")) decode = 1;
        else if (!strcmp(argv[i], "--no-parse-special")) parse_special = 0;
        else if (!strcmp(argv[i], "--skip-special")) skip_special = 1;
        else if (!strcmp(argv[i], "--raw-newlines")) escape = 0;
        else if (!strcmp(argv[i], "--version")) { printf("dllm-tokenize (dllm %s)\n", dllm_version()); return 0; }
        else if (!strcmp(argv[i], "-m") || !strcmp(argv[i], "--model")) {
            if (i + 1 == argc) return fail("option -m needs a value (see --help)", "");
            if (dir) return fail("-m is given twice: pass it once", "");
            dir = argv[++i];
        } else {
            fprintf(stderr, argv[i][0] == '-' ? "dllm-tokenize: unknown option %s (see --help)\n" : "dllm-tokenize: unexpected argument \"%s\" (see --help)\n",
                    argv[i]);
            return 1;
        }
    }
    if (!dir) return fail("no tokenizer: pass -m DIR (see --help)", "");
    if (dllm_tokenizer_load(dir, &tok) != DLLM_OK) return fail("", dllm_last_error());
    input = read_stdin(&len);
    if (!input) { dllm_tokenizer_free(tok); return fail("cannot read stdin", ""); }
    while (pos < len && rc == 0) {
        const char *nl = (const char *)memchr(input + pos, '\n', len - pos);
        size_t line_len = nl ? (size_t)(nl - (input + pos)) : len - pos;
        line_no++;
        rc = decode ? decode_line(tok, line_no, input + pos, line_len, skip_special, escape, &ids, &cap, &text, &text_cap)
                    : encode_line(tok, line_no, input + pos, line_len, parse_special, &ids, &cap);
        pos += line_len + 1;
    }
    free(input);
    free(ids);
    free(text);
    dllm_tokenizer_free(tok);
    return rc;
}
