"""Operations: atomic writes, locks, fault injection, paths, untrusted files, user errors and
exit codes, devices, checkpoint files (plain and sharded). Skip on a first read."""
