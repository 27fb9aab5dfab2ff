"""What a run writes to survive and reads to start: checkpoints, snapshots, pretrained weights.

checkpoint       checkpoints that are complete and intact or refused (a sha256 in the archive)
snapshot_writer  snapshots copied in memory and written in the background
compressor_state PowerSGD's per-rank state beside each snapshot, restored on resume
retention        older snapshots kept beside snapshot.pt (keep_snapshots), pruned once the new one is on disk
hf               Hugging Face GPT-2 checkpoints to and from our GPT, without transformers
global_batch     whether a snapshot resumes on a number of ranks (the launcher asks it too, without torch)
resumable        what a snapshot resumes only with: batch shape, init_from, model shape (the launcher asks too)
start            where a run starts from: its snapshot (resume), pretrained weights, or scratch
"""
