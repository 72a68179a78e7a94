/* Tests: the source map (src/README.md) and the source tree it describes. Run from the repository root. */

/* Every backticked file path of src/README.md exists (relative to src/, or to the root for tests/ and tools/ paths;
 * a glob like kernels/x*.cuh names its folder), and every backticked dllm__ name occurs in the generated
 * dllm_cuda.cu. */
TEST(docs, source_map_names_what_exists) {
    const std::string map = test_read_file("src/README.md"), code = test_read_file("dllm_cuda.cu");
    CHECK(!map.empty() && !code.empty());
    int paths = 0, symbols = 0;
    for (size_t at = map.find('`'); at != std::string::npos;) {
        const size_t end = map.find('`', at + 1);
        if (end == std::string::npos) break;
        std::string name = map.substr(at + 1, end - at - 1);
        at = map.find('`', end + 1);
        if (name.rfind("dllm__", 0) == 0) {
            symbols++;
            CHECK_MSG(code.find(name) != std::string::npos, "src/README.md names %s, which the code does not have",
                      name.c_str());
            continue;
        }
        const bool is_path = name.find('/') != std::string::npos || name.find(".cpp") != std::string::npos ||
                             name.find(".cuh") != std::string::npos || name.find(".md") != std::string::npos;
        if (!is_path || name.find(' ') != std::string::npos) continue;
        const size_t star = name.find('*');
        if (star != std::string::npos) name = name.substr(0, name.rfind('/', star) + 1);
        struct stat sb;
        const bool found = stat(("src/" + name).c_str(), &sb) == 0 || stat(name.c_str(), &sb) == 0;
        paths++;
        CHECK_MSG(found, "src/README.md names %s, which is neither under src/ nor the root", name.c_str());
    }
    CHECK(paths > 30 && symbols > 15);  // the map still maps
}

/* Every file the root includes exists and every src/ host file is included: none is forgotten by the amalgamation. */
TEST(docs, every_source_file_is_in_the_amalgamation) {
    const std::string code = test_read_file("dllm_cuda.cu");
    int files = 0;
    for (const char *dir :
         {"src", "src/model", "src/tokenizer", "src/cpu", "src/soloq", "src/gpu", "src/decode", "src/kernels"}) {
        DIR *d = opendir(dir);
        CHECK_MSG(d != nullptr, "no folder %s", dir);
        if (!d) continue;
        while (dirent *e = readdir(d)) {
            const std::string n = e->d_name;
            if (n.size() < 5 || (n.substr(n.size() - 4) != ".cpp" && n.substr(n.size() - 4) != ".cuh")) continue;
            files++;
            const std::string mark = "#line 1 \"" + std::string(dir) + "/" + n + "\"";
            CHECK_MSG(code.find(mark) != std::string::npos,
                      "%s/%s is not in dllm_cuda.cu (include it from src/dllm_cuda.cu "
                      "or embed it with DLLM__KERNEL_FILE)",
                      dir, n.c_str());
        }
        closedir(d);
    }
    CHECK(files > 60);
}

/* README.md, docs/ and dllm.h name no file the repository lacks and narrate no history (tests/docs_check.sh). */
TEST(docs, readme_and_header_name_only_files_that_exist) {
    test_tmpdir dir;
    int rc = system(("bash tests/docs_check.sh >" + dir.file("log") + " 2>&1").c_str());
    const std::string log = test_read_file(dir.file("log"));
    CHECK_MSG(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "tests/docs_check.sh:\n%s", log.c_str());
}

/* Tests that need a GPU are in groups named gpu or gpu_<feature>, so that `--filter gpu` runs all of them (a GPU test
 * calls NEED_GPU() in its body: its TEST line alone, or from there to its closing brace in column 0). */
TEST(docs, gpu_test_groups_are_named_gpu) {
    int files = 0, gpu_tests = 0;
    DIR *d = opendir("tests");
    CHECK(d != nullptr);
    while (dirent *e = d ? readdir(d) : nullptr) {
        const std::string n = e->d_name;
        if (n.size() < 5 || n.substr(n.size() - 4) != ".inl") continue;
        files++;
        const std::string text = test_read_file("tests/" + n);
        const std::string need_gpu = std::string("NEED_GPU") + "();";  // the call, not this line
        for (size_t at = text.find("\nTEST("); at != std::string::npos; at = text.find("\nTEST(", at + 1)) {
            const size_t eol = text.find('\n', at + 1);  // a one-line test ends on its line, the others at a '}' line
            const size_t end = eol != std::string::npos && text[eol - 1] == '}' ? eol : text.find("\n}\n", at);
            const std::string body = text.substr(at, end == std::string::npos ? std::string::npos : end - at);
            const std::string group = body.substr(6, body.find(',') - 6);
            if (body.find(need_gpu) != std::string::npos) {
                gpu_tests++;
                CHECK_MSG(group == "gpu" || group.rfind("gpu_", 0) == 0,
                          "tests/%s: the GPU test group %s is not gpu_<feature>", n.c_str(), group.c_str());
            }
        }
    }
    if (d) closedir(d);
    CHECK(files > 20 && gpu_tests > 50);
    printf("    %d GPU tests in %d files\n", gpu_tests, files);
}
