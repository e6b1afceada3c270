#ifndef RINGBUFFER_H
#define RINGBUFFER_H

#include <stddef.h>

struct ringbuffer {
    unsigned char *data;
    size_t capacity;
    size_t head;
    size_t tail;
    size_t count;
};

int ringbuffer_push(struct ringbuffer *rb, unsigned char byte);
int ringbuffer_pop(struct ringbuffer *rb, unsigned char *out);

#endif
