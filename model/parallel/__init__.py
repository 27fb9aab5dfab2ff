"""Data parallelism: the ranks, what crosses the link between them, and how it is compressed.

distributed    who am I in the job (torchrun, mpirun, accelerate) and the process group
collectives    moving values between ranks; telling a failed collective from a bug
comm_hooks     the DDP communication hook: plain, bf16 or PowerSGD, and its observers
powersgd       PowerSGD gradient compression, laid out for CPUs
zero           sharded optimizer state (ZeRO stage 1)
bucket_warmup  a resumed run reduces in the same bucket layout as one that never stopped
"""
