/* reefline_classify: sends one binary PPM (P6) or PGM (P5) image to a reefline IF and prints
 * its answer (top-k classes, a tensor's first values, a crc32 IF's checksum, or the error).
 *
 *   reefline_classify ADDRESS PORT IMAGE [HEIGHT WIDTH]
 *
 * With HEIGHT and WIDTH the image is resized to them (nearest neighbour) first: a model IF
 * takes images of its input's size only. Exit status 0 answered ok, 1 an error answer or no
 * answer, 2 bad usage or an unreadable image. */
#include <reefline_client.h> /* pkg-config --cflags reefline-client */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Next header token of a netpbm file, skipping whitespace and '#' comments. */
static int next_token(FILE* f, char* out, size_t cap) {
    int c;
    size_t n = 0;
    for (;;) {
        c = fgetc(f);
        if (c == '#') {
            while (c != '\n' && c != EOF) c = fgetc(f);
        } else if (c != ' ' && c != '\t' && c != '\r' && c != '\n') {
            break;
        }
    }
    while (c != EOF && c != ' ' && c != '\t' && c != '\r' && c != '\n' && n + 1 < cap) {
        out[n++] = (char)c;
        c = fgetc(f);
    }
    out[n] = '\0';
    return n > 0;
}

static uint8_t* read_netpbm(const char* path, unsigned* height, unsigned* width, unsigned* channels) {
    FILE* f = fopen(path, "rb");
    if (!f) return NULL;
    char magic[4], w[16], h[16], maxval[16];
    uint8_t* pixels = NULL;
    if (next_token(f, magic, sizeof magic) && next_token(f, w, sizeof w) && next_token(f, h, sizeof h) &&
        next_token(f, maxval, sizeof maxval) && (strcmp(magic, "P6") == 0 || strcmp(magic, "P5") == 0) &&
        atoi(maxval) > 0 && atoi(maxval) <= 255 && atoi(w) > 0 && atoi(w) <= 65535 && atoi(h) > 0 &&
        atoi(h) <= 65535) {
        *width = (unsigned)atoi(w);
        *height = (unsigned)atoi(h);
        *channels = strcmp(magic, "P6") == 0 ? 3 : 1;
        const size_t n = (size_t)*width * *height * *channels;
        pixels = malloc(n);
        if (pixels && fread(pixels, 1, n, f) != n) {
            free(pixels);
            pixels = NULL;
        }
    }
    fclose(f);
    return pixels;
}

static uint8_t* resize_nearest(const uint8_t* in, unsigned h, unsigned w, unsigned c, unsigned oh, unsigned ow) {
    uint8_t* out = malloc((size_t)oh * ow * c);
    if (!out) return NULL;
    for (unsigned y = 0; y < oh; ++y)
        for (unsigned x = 0; x < ow; ++x)
            memcpy(out + ((size_t)y * ow + x) * c, in + ((size_t)(y * h / oh) * w + x * w / ow) * c, c);
    return out;
}

int main(int argc, char** argv) {
    if (argc != 4 && argc != 6) {
        fprintf(stderr, "usage: %s ADDRESS PORT IMAGE.ppm [HEIGHT WIDTH]\n", argv[0]);
        return 2;
    }
    unsigned h = 0, w = 0, c = 0;
    uint8_t* pixels = read_netpbm(argv[3], &h, &w, &c);
    if (!pixels) {
        fprintf(stderr, "%s: cannot read a binary PPM/PGM image\n", argv[3]);
        return 2;
    }
    if (argc == 6) {
        const unsigned oh = (unsigned)atoi(argv[4]), ow = (unsigned)atoi(argv[5]);
        if (oh == 0 || ow == 0 || oh > 65535 || ow > 65535) {
            fprintf(stderr, "HEIGHT and WIDTH: 1..65535\n");
            return 2;
        }
        uint8_t* resized = resize_nearest(pixels, h, w, c, oh, ow);
        free(pixels);
        pixels = resized;
        h = oh;
        w = ow;
        if (!pixels) return 2;
    }

    reefline_client_options o;
    reefline_client_options_init(&o);
    o.address = argv[1];
    o.port = (uint16_t)atoi(argv[2]);
    o.retries = 2;
    o.retry_timeout_ms = 500;
    reefline_client* client = NULL;
    if (reefline_client_create(&o, &client) != REEFLINE_OK) {
        fprintf(stderr, "reefline_classify: %s\n", reefline_last_error());
        free(pixels);
        return 2;
    }
    const uint16_t dims[4] = {(uint16_t)h, (uint16_t)w, (uint16_t)c, 0};
    reefline_result r = {0};
    const size_t length = (size_t)h * w * c;
    int rc = reefline_client_request(client, REEFLINE_FORMAT_IMAGE_U8_HWC, dims, pixels, length, 2000, &r);
    int status = 1;
    if (rc != REEFLINE_OK) {
        fprintf(stderr, "reefline_classify: %s\n", reefline_last_error());
    } else if (r.kind == REEFLINE_KIND_ERROR) {
        printf("error %s: %s\n", reefline_status_name(r.status), (const char*)r.payload);
    } else if (r.format == REEFLINE_FORMAT_RESULT_TOPK) {
        reefline_topk_entry top[16];
        size_t k = 0;
        if (reefline_result_topk(&r, top, 16, &k) == REEFLINE_OK) {
            for (size_t i = 0; i < k && i < 16; ++i) printf("%zu. class %u score %.4f\n", i + 1, top[i].class_index, top[i].score);
            status = 0;
        } else {
            fprintf(stderr, "reefline_classify: %s\n", reefline_last_error());
        }
    } else if (r.format == REEFLINE_FORMAT_RESULT_CRC32) {
        uint32_t counted = 0, crc = 0;
        if (reefline_result_crc32(&r, &counted, &crc) == REEFLINE_OK) {
            /* The diagnostic IF's answer is checkable: CRC32C of what it received. */
            const int match = counted == length && crc == reefline_crc32c(pixels, length);
            printf("crc32c %08x over %u bytes%s\n", crc, counted, match ? " [matches]" : " [WRONG]");
            status = match ? 0 : 1;
        }
    } else if (r.format == REEFLINE_FORMAT_RESULT_TENSOR_F32) {
        float v[8];
        size_t n = 0, nd = 0;
        uint32_t d[4];
        if (reefline_result_tensor(&r, v, 8, &n, d, &nd) == REEFLINE_OK) {
            printf("tensor of %zu values:", n);
            for (size_t i = 0; i < n && i < 8; ++i) printf(" %g", v[i]);
            printf("%s\n", n > 8 ? " ..." : "");
            status = 0;
        }
    }
    free(pixels);
    reefline_result_clear(&r);
    reefline_client_destroy(client);
    return status;
}
