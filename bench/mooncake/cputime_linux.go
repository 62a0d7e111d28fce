package mooncake

const rusageThread = 1 // RUSAGE_THREAD
