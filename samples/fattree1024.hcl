# A two-level fat tree of 1024 ranks: 32 racks of 32 nodes, each rack's leaf switch joined to
# all 16 spine switches. Per leaf: 32 x 100 Gbit/s down = 16 x 200 Gbit/s up (400 GB/s each
# way), so the tree has full bisection. 1024 nodes, 48 switches, 3072 links.

topology fattree1024 {
    class edr = 100 Gbit/s, 1 us       # a node's port to its leaf
    class up  = 200 Gbit/s, 2 us       # a leaf's port to a spine

    host rack[0..31] {
        node n[0..31]
        switch leaf
        n[0..31] <-> leaf : edr
    }
    switch spine[0..15]
    rack[0..31].leaf <-> spine[0..15] : up     # every leaf to every spine
}

collective allreduce = allreduce on fattree1024 { size = 256 MiB }
collective allgather = allgather on fattree1024 { size = 256 MiB }
collective broadcast = broadcast on fattree1024 { root = rack0.n0  size = 256 MiB }
