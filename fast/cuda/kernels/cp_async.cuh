// cp.async from global to shared memory, shared by the kernels that stage with it
// (attention_mma.cu's pair kernel, float_dense.cu's ring form). No numerics: copies only.
#ifndef CP_ASYNC_CUH
#define CP_ASYNC_CUH

__device__ __forceinline__ unsigned smem_u32(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

// cp.async of `bytes` (4, 8 or 16); src_ok false: the bytes are zero-filled (nothing is read)
template <int BYTES>
__device__ __forceinline__ void cp_async(unsigned dst, const void* src, bool src_ok)
{
    if constexpr (BYTES == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_ok ? 16 : 0));
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(src), "n"(BYTES),
                     "r"(src_ok ? BYTES : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

#endif  // CP_ASYNC_CUH
