"""HTTP tests against a real server (in a thread of the test process, or a process)."""
