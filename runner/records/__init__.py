"""The run folder's records, below everything that writes or reads them (the worker, the reports, the launchers):
the object that names every file of a run (paths), how each rank ended (outcomes), what the ranks record of their
collectives (dumps), and the files by which ranks are asked for them and a hang's verdict is kept (watch_files)."""
