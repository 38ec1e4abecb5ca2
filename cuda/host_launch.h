// The entry the tests call on the host build (appended after interpret.cu,
// whose FcCall it needs; cuda/host.h has the block runner): run `kernel`
// as block `block` of `grid`, `threads` threads a block, on this host
// thread, with the parameters at `call` (copied, as a launch does).
extern "C" void fc_host_launch(void (*kernel)(FcCall), const FcCall *call, unsigned block, unsigned grid,
                               unsigned threads) {
    struct Job {
        void (*kernel)(FcCall);
        FcCall call;
    } job = {kernel, *call};
    fc_run_block([](const void *p) {
        const Job *j = (const Job *)p;
        j->kernel(j->call);
    }, &job, block, grid, threads);
}
