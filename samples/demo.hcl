# A small 4-rank program that runs quickly over local sockets: the README's main example.
# A ring of fast links with two slower diagonals; `hcc compile` packs trees over all of them.

topology demo {
    node r[0..3]
    class fast = 1 GB/s, 10 us
    class slow = 250 MB/s, 50 us
    r0 <-> r1 : fast
    r1 <-> r2 : fast
    r2 <-> r3 : fast
    r3 <-> r0 : fast
    r0 <-> r2 : slow
    r1 <-> r3 : slow
}

collective allreduce = allreduce on demo {
    size  = 4 MiB
    dtype = float32
    op    = sum
}

collective broadcast = broadcast on demo {
    root = r0
    size = 4 MiB
}

collective allgather = allgather on demo {
    size = 4 MiB
}

collective reduce_scatter = reduce_scatter on demo {
    size = 4 MiB
}
