#include <stddef.h>
#include <stdint.h>

static uint32_t table[256];
static int table_ready = 0;

static void build_table(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) {
            c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        }
        table[i] = c;
    }
    table_ready = 1;
}

/* CRC-32 checksum of a byte buffer (IEEE polynomial), as used by zip and PNG. */
uint32_t crc32(const uint8_t *buf, size_t len) {
    if (!table_ready) {
        build_table();
    }
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < len; i++) {
        c = table[(c ^ buf[i]) & 0xFF] ^ (c >> 8);
    }
    return c ^ 0xFFFFFFFFu;
}
