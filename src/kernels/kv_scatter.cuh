/* One CTA a row, 16 bytes a thread a pass (width and both strides are multiples of 8 elements: 16-byte aligned
 * rows). */
KERNEL_kv_scatter_rows {
    pdl_enter();
    const int r = blockIdx.x;
    if (r >= n_rows) return;
    const uint4 *from = (const uint4 *)(src + (u64)r * src_stride);
    uint4 *to = (uint4 *)(cache + (u64)(cache_rows ? cache_rows[r] : r) * cache_stride);
    for (int i = threadIdx.x; i < width / 8; i += blockDim.x) to[i] = from[i];
}
