// Reading a CUBIN (the ELF image NVRTC makes for one GPU architecture): its architecture, from
// the ELF header's flags, and its entry kernels, from the symbol table (global functions marked
// as CUDA entries), each with the size and offset of every parameter, from the
// EIATTR_KPARAM_INFO records of its `.nv.info.<kernel>` section. That is what the soft GPU checks
// against its host build of the same kernels when a module is loaded.
#include <cstring>
#include <map>
#include <string>

#include "softgpu.hpp"

namespace sg {

namespace {

const uint16_t EM_CUDA = 190;
const uint32_t SHT_SYMTAB = 2;
const uint8_t STT_FUNC = 2;
const uint8_t STB_GLOBAL = 1;
const uint8_t STO_CUDA_ENTRY = 0x10;
const uint8_t EIFMT_SVAL = 4;
const uint8_t EIATTR_KPARAM_INFO = 0x17;

struct Section {
    std::string name;
    uint32_t name_offset;
    uint32_t type;
    uint64_t offset, size;
    uint32_t link;
    uint64_t entsize;
};

template <class T>
bool get(const unsigned char* b, size_t len, uint64_t at, T* v) {
    if (at > len || len - at < sizeof(T)) return false;
    memcpy(v, b + at, sizeof(T));
    return true;
}

std::string cstr(const unsigned char* b, size_t len, uint64_t at) {
    std::string s;
    while (at < len && b[at] != 0) s.push_back((char)b[at++]);
    return s;
}

} // namespace

bool read_cubin(const unsigned char* b, size_t len, int* arch, std::vector<CubinKernel>* kernels,
                std::string* why) {
    if (len < 64 || memcmp(b, "\x7f" "ELF", 4) != 0 || b[4] != 2 || b[5] != 1) {
        *why = "not a 64-bit little-endian ELF image";
        return false;
    }
    uint16_t machine = 0, shentsize = 0, shnum = 0, shstrndx = 0;
    uint32_t flags = 0;
    uint64_t shoff = 0;
    get(b, len, 0x12, &machine);
    get(b, len, 0x28, &shoff);
    get(b, len, 0x30, &flags);
    get(b, len, 0x3a, &shentsize);
    get(b, len, 0x3c, &shnum);
    get(b, len, 0x3e, &shstrndx);
    if (machine != EM_CUDA) {
        *why = "an ELF image for machine " + std::to_string(machine) + ", not a CUBIN (EM_CUDA = 190)";
        return false;
    }
    // CUDA's ELF ABI keeps the SM version in bits 8..15 of e_flags (0x5a: sm_90).
    *arch = (int)((flags >> 8) & 0xff);
    if (shentsize < 64 || shnum == 0 || shstrndx >= shnum) {
        *why = "a CUBIN without section headers";
        return false;
    }
    std::vector<Section> secs;
    for (uint16_t i = 0; i < shnum; i++) {
        uint64_t o = shoff + (uint64_t)i * shentsize;
        Section s{};
        if (!get(b, len, o, &s.name_offset) || !get(b, len, o + 4, &s.type) || !get(b, len, o + 24, &s.offset) ||
            !get(b, len, o + 32, &s.size) || !get(b, len, o + 40, &s.link) || !get(b, len, o + 56, &s.entsize)) {
            *why = "a CUBIN cut short in its section headers";
            return false;
        }
        secs.push_back(s);
    }
    const uint64_t names = secs[shstrndx].offset;
    for (auto& s : secs) s.name = cstr(b, len, names + s.name_offset);

    std::map<std::string, const Section*> by_name;
    for (auto& s : secs) by_name[s.name] = &s;

    for (auto& s : secs) {
        if (s.type != SHT_SYMTAB || s.link >= secs.size()) continue;
        const Section& strtab = secs[s.link];
        for (uint64_t o = s.offset; o + 24 <= s.offset + s.size; o += 24) {
            uint32_t name = 0;
            uint8_t info = 0, other = 0;
            get(b, len, o, &name);
            get(b, len, o + 4, &info);
            get(b, len, o + 5, &other);
            if ((info & 0xf) != STT_FUNC || (info >> 4) != STB_GLOBAL || (other & STO_CUDA_ENTRY) == 0) continue;
            CubinKernel k;
            k.name = cstr(b, len, strtab.offset + name);
            auto it = by_name.find(".nv.info." + k.name);
            if (it == by_name.end()) {
                *why = "kernel " + k.name + " has no .nv.info section";
                return false;
            }
            const Section* nv = it->second;
            std::map<uint16_t, std::pair<uint32_t, uint32_t>> params; // ordinal -> (size, offset)
            for (uint64_t a = nv->offset; a + 4 <= nv->offset + nv->size;) {
                uint8_t fmt = b[a], attr = b[a + 1];
                uint16_t size = 0;
                get(b, len, a + 2, &size);
                if (fmt != EIFMT_SVAL) {
                    a += 4; // the other formats carry their value in the 2 bytes after the header
                    continue;
                }
                if (attr == EIATTR_KPARAM_INFO && size >= 12) {
                    uint16_t ordinal = 0, offset = 0;
                    uint32_t bits = 0;
                    get(b, len, a + 4 + 4, &ordinal);
                    get(b, len, a + 4 + 6, &offset);
                    get(b, len, a + 4 + 8, &bits);
                    params[ordinal] = {bits >> 18, offset};
                }
                a += 4 + size;
            }
            for (uint16_t i = 0; i < params.size(); i++) {
                auto p = params.find(i);
                if (p == params.end()) {
                    *why = "kernel " + k.name + " lists parameter ordinals with a gap";
                    return false;
                }
                k.param_sizes.push_back(p->second.first);
                k.param_offsets.push_back(p->second.second);
            }
            kernels->push_back(std::move(k));
        }
    }
    if (kernels->empty()) {
        *why = "a CUBIN without entry kernels";
        return false;
    }
    return true;
}

} // namespace sg
