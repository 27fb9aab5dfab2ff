"""The GPT-2 model and how it computes and learns.

model            GPT-2 in one file, laid out so OpenAI's checkpoints load without renaming
fused_loss       the output projection and cross-entropy in one step, without fp32 logits (CPU kernel)
fused_loss_cuda  the same on a CUDA GPU: one Triton kernel over the bf16 logits
optim            AdamW and its learning-rate schedule, gradient clipping
device           which device a rank computes on: the CPU or the GPU numbered LOCAL_RANK
precision        autocast dtype by CPU flags or GPU capability, torch.compile, IPEX and allocator choices
memory_estimate  how much memory one rank of a run needs, from its config alone (torch-free)
"""
