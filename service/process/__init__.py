"""The process: the server's assembly, startup and shutdown, the command line and its flags, `slotserve check`,
signals, timers, the handler threads, options and metrics (docs/architecture.md)."""
