"""launcher=ssh: `run` logs in to every host with the system ssh client and starts each host's share there
(runner.launchers.ssh.launcher says how). Its modules: host (the data model, a leaf), address (where a host is
dialled), check (before anything starts), protocol (what `run` says over each session's stdin), session (the running
part), collect (the records after the run), launcher (SshLauncher, which ties them)."""
