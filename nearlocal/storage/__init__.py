"""Reload from storage: raw io_uring (uring), compiled timed pread / pwrite / io_uring loops
(kernels), the `storage:PATH` region (regions), `file-read` / `file-write` and the `storage`
suite (methods). See docs/storage.md."""
