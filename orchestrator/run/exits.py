"""Every command's exit statuses, each with what it means and what to do: the one definition the
commands return and the documentation's tables print (orchestrator.reference)."""

import signal

EXIT_DONE = 0
EXIT_REGRESSION = 1  # a night of the nightly job, or `report --compare`, found a regression
EXIT_USAGE = 2  # bad input; also another driver took the launch between its check and its lock
# The launch finished and answered, but trials failed for good, or every run of a pair diverged or failed.
EXIT_TRIALS_FAILED = 3
# A tracking or search store stayed unreachable through every retry, or a disk filled up: resumable.
EXIT_STORE_UNREACHABLE = 4
EXIT_INTERRUPTED = 130
EXIT_READER_GONE = 128 + signal.SIGPIPE  # `orchestrator status | head -1`: the reader has what it wanted

STATUSES = {
    EXIT_DONE: (
        "done: every trial completed (`report --compare`, `nightly`: and no regression)",
        "",
    ),
    EXIT_REGRESSION: (
        "a regression (`nightly`, `report --compare`); for `train`, a trial that did not complete; "
        "an unexpected error, printed with its traceback (such as the local Ray instance of a launch "
        "without `--address` killed under it by a SIGTERM sent to the driver's whole process group)",
        "read the `REGRESSION` lines; fix, or `orchestrator accept` ([nightly]({docs}guide/nightly.md)); "
        "after an unexpected error, `orchestrator resume` continues a launch",
    ),
    EXIT_USAGE: (
        "bad input: a file, a flag, an `--address` where no Ray cluster answers, a store that refuses "
        "for good (no such database, credentials refused); nothing launched or written",
        "read the one line ([what a launch refuses]({docs}guide/searching.md#what-a-launch-refuses))",
    ),
    EXIT_TRIALS_FAILED: (
        "finished and answered, but trials failed, or every run of a pair diverged or failed",
        "the answer names such a pair, the report's trial tables and `export`'s `error` column say how "
        "each trial ended; `orchestrator resume` runs again those that failed after their retries",
    ),
    EXIT_STORE_UNREACHABLE: (
        "a tracking or search store stayed unreachable through every retry, or a disk the launch "
        "writes to filled up",
        "`orchestrator resume` once the store answers or space is freed (where nothing was started: "
        "the same command again)",
    ),
    EXIT_INTERRUPTED: ("interrupted: Ctrl-C or SIGTERM", "`orchestrator resume`"),
    EXIT_READER_GONE: (
        "the reader of its output went away (`orchestrator status` piped into `head -1`); a launch, "
        "`nightly` and `resume` go on instead",
        "",
    ),
}
