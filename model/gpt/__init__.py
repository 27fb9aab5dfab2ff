"""The GPT-2 model and how it computes and learns.

model            GPT-2 in one file, laid out so OpenAI's checkpoints load without renaming
fused_loss       the output projection and cross-entropy in one step, without fp32 logits
optim            AdamW and its learning-rate schedule, gradient clipping
precision        bf16 autocast, torch.compile, IPEX and allocator choices for the CPU
memory_estimate  how much memory one rank of a run needs, from its config alone (torch-free)
"""
