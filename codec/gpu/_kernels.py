"""CUDA source of the GPU codec's kernels (compiled once with NVRTC through CuPy).

Kernels:

* ``xxh3_blocks`` / ``xxh3_scan`` / ``xxh3_final`` — XXH3-64 (seed 0, the default secret),
  bit-identical to ``xxhash.xxh3_64_intdigest``, over many buffers at once. XXH3 adds
  each 1 KiB block's stripes into eight accumulators and scrambles them once per
  block; the additions do not depend on the accumulators, so every block's sum is
  computed in parallel (``xxh3_blocks``), then one thread per accumulator lane runs the
  cheap scramble chain (``xxh3_scan``) and one thread per buffer merges (``xxh3_final``).
* ``split<T, MODE, EBITS, MBITS>`` — raw words (XOR a delta base on the fly) into the
  byte planes of ``s4fs.codec._planes`` (the same planes, byte for byte), and flags the
  planes whose bytes are all equal.
* ``merge<...>`` — the inverse, XOR-ing the base back in.
* ``copy_segments`` / ``fill_segments`` — batched gathers and fills (blob assembly).
* ``block_flags`` — which blocks of many buffers hold a non-zero byte (zero blocks).
* ``sample_histograms`` / ``plane_entropy`` — byte histograms of a sample of every plane,
  and from them each plane's order-0 entropy and zero share (the codec choice).
* ``xxh3_run_blocks`` / ``xxh3_chain`` — XXH3 accumulators of a whole file laid out as
  runs of stripes in several buffers (``s4fs.save`` of device tensors: the file's
  XXH3-128 without the file existing anywhere in one piece).
* ``crc32_blocks`` / ``crc32_join`` — zip CRC-32 of many records, block-parallel.

Pointers travel as 64-bit integers, so one signature serves every buffer. Every
kernel avoids shared memory, barriers and warp intrinsics: running its blocks and
threads one after another on a CPU gives the same result, which is how the tests
check the kernels on machines without a GPU (``_emulate``).
"""

from __future__ import annotations

# XXH3's default 192-byte secret (a constant of the algorithm)
XXH3_SECRET = bytes.fromhex(
    "b8fe6c3923a44bbe7c01812cf721ad1cded46de9839097db7240a4a4b7b3671f"
    "cb79e64eccc0e578825ad07dccff7221b8084674f743248ee03590e6813a264c"
    "3c2852bb91c300cb88d0658b1b532ea371644897a20df94e3819ef46a9deacd8"
    "a8fa763fe39c343ff9dcbbc7c70b4f1d8a51e04bcdb45931c89f7ec9d9787364"
    "eac5ac8334d3ebc3c581a0fffa1363eb170ddd51b7f0da49d316552629d4689e"
    "2b16be587d47a1fc8ff8b8d17ad031ce45cb3a8f95160428afd7fbcabb4b407e")

# descriptor of one split/merge item: 24 int64 fields
DESC_FIELDS = 24
D_SRC, D_BASE, D_N, D_TAIL, D_FLAG, D_TAILPTR, D_PLANES = 0, 1, 2, 3, 4, 5, 8
MAX_PLANES = DESC_FIELDS - D_PLANES

# (T, MODE, EBITS, MBITS) instantiations; MODE: 0 flat, 1 float, 2 float magnitude, 3 bytes
MODE_FLAT, MODE_FLOAT, MODE_MAG, MODE_BYTES, MODE_SM = 0, 1, 2, 3, 4
_CTYPE = {1: "unsigned char", 2: "unsigned short", 4: "unsigned int", 8: "unsigned long long"}


def _u64_le(buf: bytes, off: int) -> int:
    return int.from_bytes(buf[off: off + 8], "little")


def _consts() -> str:
    s = XXH3_SECRET
    key = ", ".join(f"0x{_u64_le(s, 8 * j):016x}ULL" for j in range(24))
    last = ", ".join(f"0x{_u64_le(s, 121 + 8 * j):016x}ULL" for j in range(8))
    merge = ", ".join(f"0x{_u64_le(s, 11 + 8 * j):016x}ULL" for j in range(8))
    raw = ", ".join(str(b) for b in s)
    return (f"__constant__ u64 XKEY[24] = {{{key}}};\n"
            f"__constant__ u64 XLAST[8] = {{{last}}};\n"
            f"__constant__ u64 XMERGE[8] = {{{merge}}};\n"
            f"__constant__ u8 XSECRET[192] = {{{raw}}};\n")


def kernel_name(kind: str, itemsize: int, mode: int, ebits: int, mbits: int) -> str:
    """The C++ name expression of one split/merge instantiation."""
    return f"{kind}<{_CTYPE[itemsize]}, {mode}, {ebits}, {mbits}>"


_BODY = r"""
typedef unsigned long long u64;
typedef long long i64;
typedef unsigned int u32;
typedef unsigned char u8;

#define P32_1 0x9E3779B1ULL
#define P32_2 0x85EBCA77ULL
#define P32_3 0xC2B2AE3DULL
#define P64_1 0x9E3779B185EBCA87ULL
#define P64_2 0xC2B2AE3D27D4EB4FULL
#define P64_3 0x165667B19E3779F9ULL
#define P64_4 0x85EBCA77C2B2AE63ULL
#define P64_5 0x27D4EB2F165667C5ULL
#define PMX1 0x165667919E3779F9ULL
#define PMX2 0x9FB21C651E98DF25ULL

@CONSTS@

__constant__ u64 XINIT[8] = {P32_3, P64_1, P64_2, P64_3, P64_4, P32_2, P64_5, P32_1};

__device__ __forceinline__ u64 rd64(const u8* p) {
    u64 v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
    return v;
}
__device__ __forceinline__ u32 rd32(const u8* p) {
    return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
}
__device__ __forceinline__ u64 mulfold(u64 a, u64 b) { return (a * b) ^ __umul64hi(a, b); }
__device__ __forceinline__ u64 rotl64(u64 x, int r) { return (x << r) | (x >> (64 - r)); }
__device__ __forceinline__ u64 bswap64(u64 x) {
    u64 r = 0;
    for (int i = 0; i < 8; ++i) { r = (r << 8) | (x & 0xff); x >>= 8; }
    return r;
}
__device__ __forceinline__ u64 aval3(u64 h) { h ^= h >> 37; h *= PMX1; return h ^ (h >> 32); }
__device__ __forceinline__ u64 aval64(u64 h) {
    h ^= h >> 33; h *= P64_2; h ^= h >> 29; h *= P64_3; return h ^ (h >> 32);
}
__device__ __forceinline__ u64 mix16(const u8* in, int soff) {
    return mulfold(rd64(in) ^ rd64(XSECRET + soff), rd64(in + 8) ^ rd64(XSECRET + soff + 8));
}

// XXH3-64 of at most 240 bytes (byte reads: any alignment)
__device__ u64 xxh3_short(const u8* p, u64 len) {
    if (len <= 16) {
        if (len > 8) {
            u64 lo = rd64(p) ^ (rd64(XSECRET + 24) ^ rd64(XSECRET + 32));
            u64 hi = rd64(p + len - 8) ^ (rd64(XSECRET + 40) ^ rd64(XSECRET + 48));
            return aval3(len + bswap64(lo) + hi + mulfold(lo, hi));
        }
        if (len >= 4) {
            u64 in1 = rd32(p), in2 = rd32(p + len - 4);
            u64 h = (in2 + (in1 << 32)) ^ (rd64(XSECRET + 8) ^ rd64(XSECRET + 16));
            h ^= rotl64(h, 49) ^ rotl64(h, 24);
            h *= PMX2;
            h ^= (h >> 35) + len;
            h *= PMX2;
            return h ^ (h >> 28);
        }
        if (len > 0) {
            u32 c = ((u32)p[0] << 16) | ((u32)p[len >> 1] << 24) | (u32)p[len - 1] | ((u32)len << 8);
            return aval64((u64)c ^ (u64)(rd32(XSECRET) ^ rd32(XSECRET + 4)));
        }
        return aval64(rd64(XSECRET + 56) ^ rd64(XSECRET + 64));
    }
    u64 acc = len * P64_1;
    if (len <= 128) {
        if (len > 32) {
            if (len > 64) {
                if (len > 96) {
                    acc += mix16(p + 48, 96);
                    acc += mix16(p + len - 64, 112);
                }
                acc += mix16(p + 32, 64);
                acc += mix16(p + len - 48, 80);
            }
            acc += mix16(p + 16, 32);
            acc += mix16(p + len - 32, 48);
        }
        acc += mix16(p, 0);
        acc += mix16(p + len - 16, 16);
        return aval3(acc);
    }
    for (int i = 0; i < 8; ++i) acc += mix16(p + 16 * i, 16 * i);
    acc = aval3(acc);
    int rounds = (int)(len / 16);
    for (int i = 8; i < rounds; ++i) acc += mix16(p + 16 * i, 16 * (i - 8) + 3);
    acc += mix16(p + len - 16, 136 - 17);
    return aval3(acc);
}

// one 16-byte pair of a stripe into the accumulators (stripe j of its block, pair q)
__device__ __forceinline__ void acc_pair(u64* acc, int j, int q, u64 d0, u64 d1) {
    u64 k0 = d0 ^ XKEY[j + 2 * q], k1 = d1 ^ XKEY[j + 2 * q + 1];
    acc[2 * q + 1] += d0;
    acc[2 * q] += d1;
    acc[2 * q] += (k0 & 0xffffffffULL) * (k0 >> 32);
    acc[2 * q + 1] += (k1 & 0xffffffffULL) * (k1 >> 32);
}

// the scramble chain of one lane over nfull whole blocks' sums (c: that lane's first sum)
// (the chain is serial; its sums are loaded 16 at a time, so the loads overlap)
__device__ __forceinline__ u64 scramble(u64 acc, u64 sum, u64 key) {
    acc += sum;
    acc ^= acc >> 47;
    acc ^= key;
    return acc * P32_1;
}
__device__ __forceinline__ u64 chain_lane(const u64* c, u64 nfull, int lane) {
    u64 acc = XINIT[lane];
    u64 key = XKEY[16 + lane];
    u64 b = 0;
    for (; b + 16 <= nfull; b += 16) {
        u64 v[16];
#pragma unroll
        for (int j = 0; j < 16; ++j) v[j] = c[8 * (b + j)];
#pragma unroll
        for (int j = 0; j < 16; ++j) acc = scramble(acc, v[j], key);
    }
    for (; b < nfull; ++b) acc = scramble(acc, c[8 * b], key);
    return acc;
}

// items: 4 u64 per buffer: pointer (16-byte aligned when len > 240), length, offset of
// its block sums in `sums` (in blocks of 8 u64), unused. One thread per (block, lane):
// lane l adds word l^1 and the product of word l with the key; the eight threads of a
// block read its stripes together (16 bytes each, coalesced).
extern "C" __global__ void xxh3_blocks(const u64* items, u64* sums) {
    const u64* it = items + 4 * (u64)blockIdx.y;
    u64 len = it[1];
    if (len <= 240) return;
    const u8* p = (const u8*)it[0];
    u64 nfull = (len - 1) / 1024;
    u64* out = sums + 8 * it[2];
    u64 step = (u64)gridDim.x * blockDim.x;
    for (u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x; t < 8 * (nfull + 1); t += step) {
        u64 b = t >> 3;
        int lane = (int)(t & 7);
        int nstripes = b < nfull ? 16 : (int)(((len - 1) - 1024 * nfull) / 64);
        const ulonglong2* w = (const ulonglong2*)(p + 1024 * b) + (lane >> 1);
        u64 acc = 0;
#pragma unroll
        for (int s = 0; s < 16; ++s) {
            if (s < nstripes) {
                ulonglong2 v = w[4 * s];
                u64 mine = (lane & 1) ? v.y : v.x, other = (lane & 1) ? v.x : v.y;
                u64 k = mine ^ XKEY[s + lane];
                acc += other + (k & 0xffffffffULL) * (k >> 32);
            }
        }
        out[8 * b + lane] = acc;
    }
}

extern "C" __global__ void xxh3_scan(const u64* items, const u64* sums, u64* accs, u64 n_items) {
    u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= 8 * n_items) return;
    u64 item = t >> 3;
    int lane = (int)(t & 7);
    const u64* it = items + 4 * item;
    u64 len = it[1];
    if (len <= 240) return;
    const u8* p = (const u8*)it[0];
    const u64* c = sums + 8 * it[2] + lane;
    u64 nfull = (len - 1) / 1024;
    u64 acc = chain_lane(c, nfull, lane) + c[8 * nfull];
    const u8* last = p + len - 64;
    u64 dv = rd64(last + 8 * lane);
    u64 dk = dv ^ XLAST[lane];
    acc += rd64(last + 8 * (lane ^ 1)) + (dk & 0xffffffffULL) * (dk >> 32);
    accs[8 * item + lane] = acc;
}

extern "C" __global__ void xxh3_final(const u64* items, const u64* accs, u64* hashes, u64 n_items) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_items) return;
    const u64* it = items + 4 * i;
    u64 len = it[1];
    if (len <= 240) {
        hashes[i] = xxh3_short((const u8*)it[0], len);
        return;
    }
    const u64* a = accs + 8 * i;
    u64 r = len * P64_1;
    for (int k = 0; k < 4; ++k) r += mulfold(a[2 * k] ^ XMERGE[2 * k], a[2 * k + 1] ^ XMERGE[2 * k + 1]);
    hashes[i] = aval3(r);
}

// ---------------------------------------------------------------- planes

// eight words at a time, kept in registers (every index is a constant after unrolling)
template <typename T> struct Group { T w[8]; };

template <typename T>
__device__ __forceinline__ void load_group(const T* p, i64 cnt, Group<T>& g) {
    if (cnt == 8) {
        if (sizeof(T) == 1) {
            u64 v = *(const u64*)p;
#pragma unroll
            for (int j = 0; j < 8; ++j) g.w[j] = (T)(v >> (8 * j));
        } else if (sizeof(T) == 2) {
            uint4 v = *(const uint4*)p;
            u32 x[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int j = 0; j < 8; ++j) g.w[j] = (T)(x[j / 2] >> (16 * (j % 2)));
        } else if (sizeof(T) == 4) {
            uint4 a = ((const uint4*)p)[0], b = ((const uint4*)p)[1];
            u32 x[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
            for (int j = 0; j < 8; ++j) g.w[j] = (T)x[j];
        } else {
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                ulonglong2 v = ((const ulonglong2*)p)[r];
                g.w[2 * r] = (T)v.x;
                g.w[2 * r + 1] = (T)v.y;
            }
        }
    } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) g.w[j] = j < cnt ? p[j] : (T)0;
    }
}

template <typename T>
__device__ __forceinline__ void store_group(T* p, i64 cnt, const Group<T>& g) {
    if (cnt == 8) {
        if (sizeof(T) == 1) {
            u64 v = 0;
#pragma unroll
            for (int j = 0; j < 8; ++j) v |= (u64)(u8)g.w[j] << (8 * j);
            *(u64*)p = v;
        } else if (sizeof(T) == 2) {
            u32 x[4];
#pragma unroll
            for (int q = 0; q < 4; ++q) x[q] = (u32)(unsigned short)g.w[2 * q] | ((u32)(unsigned short)g.w[2 * q + 1] << 16);
            uint4 v;
            v.x = x[0]; v.y = x[1]; v.z = x[2]; v.w = x[3];
            *(uint4*)p = v;
        } else if (sizeof(T) == 4) {
            uint4 a, b;
            a.x = (u32)g.w[0]; a.y = (u32)g.w[1]; a.z = (u32)g.w[2]; a.w = (u32)g.w[3];
            b.x = (u32)g.w[4]; b.y = (u32)g.w[5]; b.z = (u32)g.w[6]; b.w = (u32)g.w[7];
            ((uint4*)p)[0] = a;
            ((uint4*)p)[1] = b;
        } else {
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                ulonglong2 v;
                v.x = (u64)g.w[2 * r];
                v.y = (u64)g.w[2 * r + 1];
                ((ulonglong2*)p)[r] = v;
            }
        }
    } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) if (j < cnt) p[j] = g.w[j];
    }
}

template <int MODE, int EB, int MB, int W> struct Layout {
    static const int NE = (EB + 7) / 8;
    static const int NM = (MB + 7) / 8;
    static const int SIGN = (MODE == 1 || MODE == 2) ? 1 : 0;
    static const int NP = MODE == 1 ? NE + NM : ((MODE == 3 || MODE == 4) ? W : 1);  // after the sign
};

// byte k (0 <= k < NP) of word w's non-sign planes
template <typename T, int MODE, int EB, int MB>
__device__ __forceinline__ u8 plane_byte(T w, int k) {
    typedef Layout<MODE, EB, MB, (int)sizeof(T)> L;
    u64 x = (u64)w;
    if (MODE == 1) {
        if (k < L::NE) {
            u64 e = (x >> MB) & ((1ULL << EB) - 1);
            return (u8)(e >> (8 * (L::NE - 1 - k)));
        }
        u64 m = x & ((1ULL << MB) - 1);
        return (u8)(m >> (8 * (L::NM - 1 - (k - L::NE))));
    }
    if (MODE == 2) return (u8)(x & ((1ULL << (8 * sizeof(T) - 1)) - 1));
    if (MODE == 4) {   // exponent byte, sign|top 7 mantissa bits, then the lower bytes
        if (k == 0) return (u8)(x >> MB);
        if (k == 1) return (u8)((((x >> (8 * sizeof(T) - 1)) & 1) << 7) | ((x >> (MB - 7)) & 0x7f));
        return (u8)(x >> (8 * ((int)sizeof(T) - 1 - k)));
    }
    if (MODE == 3) return (u8)(x >> (8 * k));
    return (u8)x;
}

template <typename T>
__device__ __forceinline__ u8 sign_byte(const Group<T>& g) {
    u8 s = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) s |= (u8)((((u64)g.w[j]) >> (8 * sizeof(T) - 1)) & 1) << j;
    return s;
}

__device__ __forceinline__ void flag_plane(u32* flags, i64 idx) {
    if (!((volatile u32*)flags)[idx]) atomicOr(flags + idx, 1u);
}

// descriptor (24 i64): 0 src, 1 base (0: none), 2 words, 3 tail bytes, 4 flag index,
// 5 tail plane, 8.. plane pointers (sign first when the layout has one)
template <typename T, int MODE, int EB, int MB>
__global__ void split(const i64* descs, u32* flags) {
    typedef Layout<MODE, EB, MB, (int)sizeof(T)> L;
    const i64* d = descs + 24 * (i64)blockIdx.y;
    const T* src = (const T*)d[0];
    const T* base = (const T*)d[1];
    i64 n = d[2];
    i64 ngroups = (n + 7) / 8;
    i64 fidx = d[4];
    u8* const* planes = (u8* const*)(d + 8);
    // group 0 is the reference of the constant-plane test
    Group<T> r;
    u8 rsign = 0, rbyte[L::NP];
    if (n > 0) {
        load_group<T>(src, n < 8 ? n : 8, r);
        if (base) {
            Group<T> rb;
            load_group<T>(base, n < 8 ? n : 8, rb);
#pragma unroll
            for (int j = 0; j < 8; ++j) r.w[j] ^= rb.w[j];
        }
        rsign = sign_byte<T>(r);
#pragma unroll
        for (int k = 0; k < L::NP; ++k) rbyte[k] = plane_byte<T, MODE, EB, MB>(r.w[0], k);
    }
    // which planes differ from the reference, over this thread's groups (flagged once,
    // after the loop: one atomic per thread and plane, not one read per group)
    bool sdiff = false, pdiff[L::NP];
#pragma unroll
    for (int k = 0; k < L::NP; ++k) pdiff[k] = false;
    i64 step = (i64)gridDim.x * blockDim.x;
    for (i64 gi = (i64)blockIdx.x * blockDim.x + threadIdx.x; gi <= ngroups; gi += step) {
        if (gi == ngroups) {   // bytes past the last whole word
            i64 tail = d[3];
            const u8* s8 = (const u8*)src + n * sizeof(T);
            const u8* b8 = base ? (const u8*)base + n * sizeof(T) : 0;
            u8* t8 = (u8*)d[5];
            for (i64 k = 0; k < tail; ++k) t8[k] = s8[k] ^ (b8 ? b8[k] : 0);
            continue;
        }
        i64 cnt = n - 8 * gi < 8 ? n - 8 * gi : 8;
        Group<T> g;
        load_group<T>(src + 8 * gi, cnt, g);
        if (base) {
            Group<T> b;
            load_group<T>(base + 8 * gi, cnt, b);
#pragma unroll
            for (int j = 0; j < 8; ++j) g.w[j] ^= b.w[j];
        }
        if (L::SIGN) {
            u8 s = sign_byte<T>(g);
            planes[0][gi] = s;
            sdiff |= s != rsign;
        }
#pragma unroll
        for (int k = 0; k < L::NP; ++k) {
            u8* out = planes[L::SIGN + k] + 8 * gi;
            bool differs = false;
            u64 v = 0;
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                u8 c = plane_byte<T, MODE, EB, MB>(g.w[j], k);
                differs |= (j < cnt) & (c != rbyte[k]);
                v |= (u64)c << (8 * j);
            }
            if (cnt == 8) {
                *(u64*)out = v;
            } else {
#pragma unroll
                for (int j = 0; j < 8; ++j) if (j < cnt) out[j] = (u8)(v >> (8 * j));
            }
            pdiff[k] |= differs;
        }
    }
    if (L::SIGN && sdiff) flag_plane(flags, fidx);
#pragma unroll
    for (int k = 0; k < L::NP; ++k)
        if (pdiff[k]) flag_plane(flags, fidx + L::SIGN + k);
}

// descriptor as for split, with 0 = destination
template <typename T, int MODE, int EB, int MB>
__global__ void merge(const i64* descs) {
    typedef Layout<MODE, EB, MB, (int)sizeof(T)> L;
    const i64* d = descs + 24 * (i64)blockIdx.y;
    T* dst = (T*)d[0];
    const T* base = (const T*)d[1];
    i64 n = d[2];
    i64 ngroups = (n + 7) / 8;
    const u8* const* planes = (const u8* const*)(d + 8);
    const int BITS = 8 * sizeof(T);
    i64 step = (i64)gridDim.x * blockDim.x;
    for (i64 gi = (i64)blockIdx.x * blockDim.x + threadIdx.x; gi <= ngroups; gi += step) {
        if (gi == ngroups) {
            i64 tail = d[3];
            u8* o8 = (u8*)dst + n * sizeof(T);
            const u8* b8 = base ? (const u8*)base + n * sizeof(T) : 0;
            const u8* t8 = (const u8*)d[5];
            for (i64 k = 0; k < tail; ++k) o8[k] = t8[k] ^ (b8 ? b8[k] : 0);
            continue;
        }
        i64 cnt = n - 8 * gi < 8 ? n - 8 * gi : 8;
        u64 w[8], e[8], m[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) { w[j] = 0; e[j] = 0; m[j] = 0; }
        if (L::SIGN) {
            u64 s = planes[0][gi];
#pragma unroll
            for (int j = 0; j < 8; ++j) w[j] = ((s >> j) & 1) << (BITS - 1);
        }
#pragma unroll
        for (int k = 0; k < L::NP; ++k) {
            const u8* in = planes[L::SIGN + k] + 8 * gi;
            u64 v = 0;
            if (cnt == 8) {
                v = *(const u64*)in;
            } else {
#pragma unroll
                for (int j = 0; j < 8; ++j) if (j < cnt) v |= (u64)in[j] << (8 * j);
            }
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                u64 c = (v >> (8 * j)) & 0xff;
                if (MODE == 1) {
                    if (k < L::NE) e[j] = (e[j] << 8) | c;
                    else m[j] = (m[j] << 8) | c;
                } else if (MODE == 4) {
                    if (k == 0) e[j] = c;
                    else if (k == 1) m[j] = c;
                    else w[j] |= c << (8 * (BITS / 8 - 1 - k));
                } else if (MODE == 3) {
                    w[j] |= c << (8 * k);
                } else {
                    w[j] |= c;
                }
            }
        }
        Group<T> g;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            u64 x = w[j];
            if (MODE == 1) x |= (e[j] << MB) | m[j];
            if (MODE == 4) {
                x |= ((e[j] >> 1) | (m[j] & 0x80)) << (BITS - 8);
                x |= (((e[j] << 7) & 0xff) | (m[j] & 0x7f)) << (BITS - 16);
            }
            g.w[j] = (T)x;
        }
        if (base) {
            Group<T> b;
            load_group<T>(base + 8 * gi, cnt, b);
#pragma unroll
            for (int j = 0; j < 8; ++j) g.w[j] ^= b.w[j];
        }
        store_group<T>(dst + 8 * gi, cnt, g);
    }
}

// ---------------------------------------------------------------- segments

// segs: 3 u64 per segment: source, destination, length. Destination words are written
// whole; a misaligned source is read as the two aligned words around each one and
// shifted together (an aligned word that holds a byte of the segment never crosses a
// page, so reading all of it is safe).
__device__ __forceinline__ u64 load_shifted(const u8* a) {
    const u64* q = (const u64*)((u64)a & ~7ULL);
    int sh = (int)((u64)a & 7) * 8;
    u64 lo = q[0];
    return sh ? (lo >> sh) | (q[1] << (64 - sh)) : lo;
}

extern "C" __global__ void copy_segments(const u64* segs, u64 nseg) {
    for (u64 s = blockIdx.x; s < nseg; s += gridDim.x) {
        const u8* src = (const u8*)segs[3 * s];
        u8* dst = (u8*)segs[3 * s + 1];
        u64 len = segs[3 * s + 2];
        u64 head = (8 - ((u64)dst & 7)) & 7;
        if (head > len) head = len;
        for (u64 i = threadIdx.x; i < head; i += blockDim.x) dst[i] = src[i];
        u64 body = (len - head) / 8;
        const u8* s2 = src + head;
        u64* d2 = (u64*)(dst + head);
        if ((((u64)s2) & 7) == 0) {
            const u64* s8 = (const u64*)s2;
            for (u64 i = threadIdx.x; i < body; i += blockDim.x) d2[i] = s8[i];
        } else {
            for (u64 i = threadIdx.x; i < body; i += blockDim.x) d2[i] = load_shifted(s2 + 8 * i);
        }
        for (u64 i = head + 8 * body + threadIdx.x; i < len; i += blockDim.x) dst[i] = src[i];
    }
}

// planes: 4 u64 each: pointer, length, offset of its 256 counters in `hist`, step.
// Counts every step-th byte: an order-0 entropy estimate that decides whether coding pays.
extern "C" __global__ void sample_histograms(const u64* planes, u32* hist) {
    const u64* it = planes + 4 * (u64)blockIdx.y;
    const u8* p = (const u8*)it[0];
    u64 len = it[1];
    u32* h = hist + it[2];
    u64 step = it[3];
    u64 stride = (u64)gridDim.x * blockDim.x * step;
    for (u64 i = ((u64)blockIdx.x * blockDim.x + threadIdx.x) * step; i < len; i += stride)
        atomicAdd(h + p[i], 1u);
}

// From n rows of 256 counters (sample_histograms): per row, its order-0 entropy in bits
// per byte and the share of zero bytes (two doubles), so that the host reads 16 bytes per
// plane instead of 1 KiB and does no per-plane arithmetic.
extern "C" __global__ void plane_entropy(const u32* hist, double* out, u64 n) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const u32* c = hist + 256 * i;
    double tot = 0.0, terms = 0.0;
    for (int k = 0; k < 256; ++k) {
        double v = (double)c[k];
        tot += v;
        if (c[k] > 1) terms += v * log2(v);
    }
    double t = tot > 1.0 ? tot : 1.0;
    out[2 * i] = log2(t) - terms / t;
    out[2 * i + 1] = (double)c[0] / t;
}

// segs: 3 u64 per segment: destination, length, byte value
extern "C" __global__ void fill_segments(const u64* segs, u64 nseg) {
    for (u64 s = blockIdx.x; s < nseg; s += gridDim.x) {
        u8* dst = (u8*)segs[3 * s];
        u64 len = segs[3 * s + 1];
        u8 val = (u8)segs[3 * s + 2];
        for (u64 i = threadIdx.x; i < len; i += blockDim.x) dst[i] = val;
    }
}
// Which blocks of many buffers hold a non-zero byte. items: 4 u64 per buffer (blockIdx.y):
// pointer, length, first flag index, log2 of the block size (at least 256); every thread
// looks at 256-byte pieces and sets its block's flag (flags start zeroed; racing stores all
// write 1).
extern "C" __global__ void block_flags(const u64* items, u8* flags) {
    const u64* it = items + 4 * blockIdx.y;
    const u8* p = (const u8*)it[0];
    u64 n = it[1], f0 = it[2], lg = it[3];
    u64 npieces = (n + 255) / 256;
    bool aligned = ((u64)p & 7) == 0;
    u64 step = (u64)gridDim.x * blockDim.x;
    for (u64 k = (u64)blockIdx.x * blockDim.x + threadIdx.x; k < npieces; k += step) {
        u64 at = 256 * k, len = n - at < 256 ? n - at : 256;
        u64 any = 0;
        if (aligned && len == 256) {
            const u64* w = (const u64*)(p + at);
            for (int i = 0; i < 32; ++i) any |= w[i];
        } else {
            for (u64 i = 0; i < len; ++i) any |= p[at + i];
        }
        if (any) flags[f0 + (at >> lg)] = 1;
    }
}
// ---------------------------------------------------------------- whole files

// XXH3 block sums of a file described as runs of whole 64-byte stripes; runs: 3 u64
// each (first stripe, stripe count, pointer to its bytes), sorted, covering stripes
// 0..total-1. Block b (16 stripes) gets its 8 lane sums in sums[8b..]; the last block
// may be partial or empty (zeros). A run pointer need not be aligned.
__device__ __forceinline__ u64 ld64(const u8* p, bool aligned) {
    return aligned ? *(const u64*)p : load_shifted(p);
}

extern "C" __global__ void xxh3_run_blocks(const u64* runs, u64 nruns, u64 total, u64* sums) {
    u64 nblocks = total / 16 + 1;
    u64 step = (u64)gridDim.x * blockDim.x;
    for (u64 b = (u64)blockIdx.x * blockDim.x + threadIdx.x; b < nblocks; b += step) {
        u64 s0 = 16 * b;
        int ns = total - s0 >= 16 ? 16 : (int)(total - s0);
        u64 acc[8];
        for (int i = 0; i < 8; ++i) acc[i] = 0;
        if (ns > 0) {
            u64 lo = 0, hi = nruns;               // last run whose first stripe <= s0
            while (hi - lo > 1) {
                u64 mid = (lo + hi) / 2;
                if (runs[3 * mid] <= s0) lo = mid; else hi = mid;
            }
            u64 r = lo;
            for (int j = 0; j < ns; ++j) {
                u64 s = s0 + j;
                while (s >= runs[3 * r] + runs[3 * r + 1]) ++r;
                const u8* p = (const u8*)runs[3 * r + 2] + 64 * (s - runs[3 * r]);
                bool al = (((u64)p) & 7) == 0;
                for (int q = 0; q < 4; ++q)
                    acc_pair(acc, j, q, ld64(p + 16 * q, al), ld64(p + 16 * q + 8, al));
            }
        }
        for (int i = 0; i < 8; ++i) sums[8 * b + i] = acc[i];
    }
}

// the scramble chain over nfull whole blocks, then the partial block's sums (8 threads)
extern "C" __global__ void xxh3_chain(const u64* sums, u64 nfull, u64* accs) {
    int lane = (int)threadIdx.x;
    if (lane >= 8) return;
    accs[lane] = chain_lane(sums + lane, nfull, lane) + sums[8 * nfull + lane];
}

// CRC-32 (zip's), in two steps. Each record is cut into CRC_BLOCK-byte blocks counted
// from its end (the first block is the short one); crc32_blocks computes each block's
// CRC register with a zero start and no final inversion, in parallel. Leading zero bytes
// do not change such a register, so every block can be taken as a whole CRC_BLOCK one,
// and crc32_join folds a record's blocks in order: c = shift(c) ^ block, where shift
// (4 tables of 256) advances a register over CRC_BLOCK zero bytes.
// items: 4 u64 per record: pointer, length, first block slot, block count.
#define CRC_BLOCK 16384
extern "C" __global__ void crc32_blocks(const u64* items, const u32* table, u32* out) {
    const u64* it = items + 4 * (u64)blockIdx.y;
    const u8* p = (const u8*)it[0];
    u64 len = it[1], nb = it[3];
    u64 pad = nb * CRC_BLOCK - len;
    u64 step = (u64)gridDim.x * blockDim.x;
    for (u64 b = (u64)blockIdx.x * blockDim.x + threadIdx.x; b < nb; b += step) {
        u64 lo = b * CRC_BLOCK < pad ? 0 : b * CRC_BLOCK - pad;
        u64 hi = (b + 1) * CRC_BLOCK - pad;
        u32 c = 0;
        u64 i = lo;
        for (; i < hi && (((u64)(p + i)) & 3); ++i) c = table[(c ^ p[i]) & 0xff] ^ (c >> 8);
        for (; i + 4 <= hi; i += 4) {
            c ^= *(const u32*)(p + i);
            c = table[768 + (c & 0xff)] ^ table[512 + ((c >> 8) & 0xff)] ^
                table[256 + ((c >> 16) & 0xff)] ^ table[c >> 24];
        }
        for (; i < hi; ++i) c = table[(c ^ p[i]) & 0xff] ^ (c >> 8);
        out[it[2] + b] = c;
    }
}

extern "C" __global__ void crc32_join(const u64* items, const u32* blocks, const u32* shift,
                                      u32* out, u64 n) {
    u64 r = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= n) return;
    const u64* it = items + 4 * r;
    const u32* bl = blocks + it[2];
    u32 c = 0;
    for (u64 b = 0; b < it[3]; ++b)
        c = shift[c & 0xff] ^ shift[256 + ((c >> 8) & 0xff)] ^ shift[512 + ((c >> 16) & 0xff)] ^
            shift[768 + (c >> 24)] ^ bl[b];
    out[r] = c;
}

"""


def source() -> str:
    return _BODY.replace("@CONSTS@", _consts())


def variant(dt, layout: int) -> tuple[int, int, int, int] | None:
    """(unit bytes, mode, ebits, mbits) of the split/merge instantiation for a dtype's
    layout, or None when no kernel handles it (the decoder then merges on the host)."""
    from .. import _planes
    if layout == _planes.FLAT:
        return 1, MODE_FLAT, 0, 0
    if layout == _planes.BYTES:
        return (dt.itemsize, MODE_BYTES, 0, 0) if dt.itemsize in _CTYPE else None
    if layout == getattr(_planes, "FLOAT_SM", None):
        ok = dt.ebits == 8 and dt.mbits % 8 == 7 and dt.word in (2, 4)
        return (dt.word, MODE_SM, dt.ebits, dt.mbits) if ok else None
    if layout != _planes.FLOAT or dt.word not in _CTYPE:
        return None
    if dt.ebits + dt.mbits <= 7:
        return dt.word, MODE_MAG, 0, 0
    return dt.word, MODE_FLOAT, dt.ebits, dt.mbits


def expressions() -> list[str]:
    """Every split/merge instantiation the known dtypes need (compiled together once)."""
    from .. import _planes
    from .._dtypes import BY_NAME
    seen: list[tuple[int, int, int, int]] = []
    layouts = [_planes.FLAT, _planes.FLOAT, _planes.BYTES]
    if hasattr(_planes, "FLOAT_SM"):
        layouts.append(_planes.FLOAT_SM)
    for dt in BY_NAME.values():
        for layout in layouts:
            if layout == _planes.FLOAT and not dt.is_float:
                continue
            v = variant(dt, layout)
            if v is not None and v not in seen:
                seen.append(v)
    return [kernel_name(k, *v) for k in ("split", "merge") for v in seen]
