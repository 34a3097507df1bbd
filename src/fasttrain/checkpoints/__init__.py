"""Checkpoints: read (weights_only, one-line errors), write (atomic), resume (which one, RNG,
SIGTERM).

load.py    read_checkpoint, load_classifier
io.py      AtomicCheckpointIO: a save is the old file or the new one, never half of each
resume.py  checkpoint_to_resume, check_fits, ResumeState
"""
