# A two-level fat tree: 8 racks of 16 nodes, each rack's leaf switch joined to all 8 spine
# switches. 16 x 12.5 GB/s down = 8 x 25 GB/s up per leaf, so the tree has full bisection.
# 128 ranks.

topology fattree {
    host rack[0..7] {
        node n[0..15]
        switch leaf
        n[0..15] <-> leaf : 100 Gbit/s, 1 us
    }
    switch spine[0..7]
    rack[0..7].leaf <-> spine[0..7] : 200 Gbit/s, 2 us     # every leaf to every spine
}

collective allreduce = allreduce on fattree {
    size = 256 MB
}

collective allgather = allgather on fattree {
    size = 128 MB
}

collective broadcast = broadcast on fattree {
    root = rack0.n0
    size = 256 MB
}
