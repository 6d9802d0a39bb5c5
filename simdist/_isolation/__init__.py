"""What a process keeps once, made per rank: state slots, the process hold,
rank-local defaults, helper threads, c10d routing, and the one registry of
process-wide patches that installs and removes them in order."""
