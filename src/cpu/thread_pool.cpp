/* src/cpu/thread_pool.cpp - the CPU thread pool. */

// ---------------------------------------------------------------------------------------------------
// 8. CPU thread pool
//    The caller runs tasks too. Each output element is computed by exactly one task in a fixed order,
//    so results do not depend on the thread count.
// ---------------------------------------------------------------------------------------------------

class dllm__pool {
  public:
    explicit dllm__pool(int n_threads) {
        try {
            for (int i = 1; i < n_threads; i++) workers_.emplace_back([this] { worker(); });
        } catch (
            ...) {  // starting a thread ran out of memory: the started ones must end (a joinable std::thread aborts)
            stop();
            throw;
        }
    }
    ~dllm__pool() { stop(); }

    /* Runs fn(0..n_tasks-1) across the pool; returns when all are done. Every worker reports back
     * before this returns, so no worker can still be reading this call's state in the next call, nor fn once it is
     * gone: a task that throws (out of memory) ends the call only after the tasks running elsewhere, the exception
     * rethrown here. */
    void run(int n_tasks, const std::function<void(int)> &fn) {
        if (workers_.empty() || n_tasks <= 1) {
            for (int i = 0; i < n_tasks; i++) fn(i);
            return;
        }
        {
            std::lock_guard<std::mutex> lk(mu_);
            fn_ = &fn;
            n_tasks_ = n_tasks;
            next_ = 0;
            reported_ = 0;
            failure_ = nullptr;
            generation_++;
        }
        wake_.notify_all();
        drain();
        std::unique_lock<std::mutex> lk(mu_);
        done_.wait(lk, [this] { return reported_ == workers_.size(); });
        fn_ = nullptr;
        if (failure_) std::rethrow_exception(failure_);
    }

  private:
    void stop() {
        {
            std::lock_guard<std::mutex> lk(mu_);
            quit_ = true;
        }
        wake_.notify_all();
        for (std::thread &t : workers_) t.join();
    }
    /* Runs tasks until none is left; a task's exception is kept for run() and leaves the remaining tasks untaken. */
    void drain() {
        try {
            for (int i = next_.fetch_add(1); i < n_tasks_; i = next_.fetch_add(1)) (*fn_)(i);
        } catch (...) {
            next_ = n_tasks_;
            std::lock_guard<std::mutex> lk(mu_);
            if (!failure_) failure_ = std::current_exception();
        }
    }
    void worker() {
        uint64_t seen = 0;
        while (true) {
            {
                std::unique_lock<std::mutex> lk(mu_);
                wake_.wait(lk, [&] { return quit_ || generation_ != seen; });
                if (quit_) return;
                seen = generation_;
            }
            drain();
            std::lock_guard<std::mutex> lk(mu_);
            if (++reported_ == workers_.size()) done_.notify_one();
        }
    }
    std::vector<std::thread> workers_;
    std::mutex mu_;
    std::condition_variable wake_, done_;
    const std::function<void(int)> *fn_ = nullptr;
    int n_tasks_ = 0;
    std::atomic<int> next_{0};
    size_t reported_ = 0;
    uint64_t generation_ = 0;
    bool quit_ = false;
    std::exception_ptr failure_;  // the first exception a task of the current call threw
};
