# NVIDIA DGX-1 (V100): 8 GPUs in a hybrid cube-mesh of NVLinks, plus the PCIe tree.
# Each V100 has 6 NVLinks of 25 GB/s per direction; pairs joined by two of them are "x2".
# Broadcast from gpu0 is bounded by its 6 NVLinks (150 GB/s) plus its PCIe uplink.

topology dgx1 {
    node gpu[0..7]
    switch pcie0, pcie1                 # PCIe switches: forward only, never own data

    class nvlink = 25 GB/s, 1 us        # one NVLink 2.0 brick, per direction
    class pcie   = 12 GB/s, 2 us        # PCIe 3.0 x16 as measured, not the 16 GB/s of the spec
    class qpi    = 10 GB/s, 3 us        # the CPU socket link between the two PCIe trees

    # the hybrid cube-mesh: the pairs joined by two NVLinks, then the pairs joined by one
    gpu0 <-> gpu[1,4] : nvlink x2    gpu1 <-> gpu3 : nvlink x2    gpu2 <-> gpu[3,6] : nvlink x2
    gpu4 <-> gpu5 : nvlink x2        gpu5 <-> gpu7 : nvlink x2    gpu6 <-> gpu7 : nvlink x2
    gpu0 <-> gpu[2,3] : nvlink       gpu1 <-> gpu[2,5] : nvlink   gpu3 <-> gpu7 : nvlink
    gpu4 <-> gpu[6,7] : nvlink       gpu5 <-> gpu6 : nvlink

    gpu[0..3] <-> pcie0 : pcie         # a star: each GPU to its PCIe switch
    gpu[4..7] <-> pcie1 : pcie
    pcie0 <-> pcie1 : qpi
}

# The same machine with the NVLinks only: broadcast from gpu0 reaches 6 x 25 = 150 GB/s
# with 4 trees (Blink, MLSys 2020).
topology dgx1_nvlink {
    node gpu[0..7]
    class nvlink = 25 GB/s, 1 us
    gpu0 <-> gpu[1,4] : nvlink x2    gpu1 <-> gpu3 : nvlink x2    gpu2 <-> gpu[3,6] : nvlink x2
    gpu4 <-> gpu5 : nvlink x2        gpu5 <-> gpu7 : nvlink x2    gpu6 <-> gpu7 : nvlink x2
    gpu0 <-> gpu[2,3] : nvlink       gpu1 <-> gpu[2,5] : nvlink   gpu3 <-> gpu7 : nvlink
    gpu4 <-> gpu[6,7] : nvlink       gpu5 <-> gpu6 : nvlink
}

# The dtype is float32 and the op sum throughout (the defaults); allreduce spells out every key.
collective broadcast        = broadcast      on dgx1        { root = gpu0  size = 500 MB }

collective allreduce = allreduce on dgx1 {
    size       = 100 MB
    dtype      = float32
    op         = sum
    algorithm  = auto
    chunk      = auto
    compress   = none
    on_failure = abort
}

collective allgather        = allgather      on dgx1        { size = 64 MB }
collective reduce_scatter   = reduce_scatter on dgx1        { size = 64 MB }
collective reduce           = reduce         on dgx1        { root = gpu0  size = 100 MB }
collective gather           = gather         on dgx1        { root = gpu0  size = 64 MB }
collective scatter          = scatter        on dgx1        { root = gpu0  size = 64 MB }
# 8 ranks x 4 B divides 64 MB: 2 000 000 elements per block
collective alltoall         = alltoall       on dgx1        { size = 64 MB }
collective broadcast_nvlink = broadcast      on dgx1_nvlink { root = gpu0  size = 500 MB }
