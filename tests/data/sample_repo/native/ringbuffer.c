#include "ringbuffer.h"

/* Append a byte to a fixed-size circular queue; returns -1 when the queue is full. */
int ringbuffer_push(struct ringbuffer *rb, unsigned char byte) {
    if (rb->count == rb->capacity) {
        return -1;
    }
    rb->data[rb->head] = byte;
    rb->head = (rb->head + 1) % rb->capacity;
    rb->count++;
    return 0;
}

/* Remove the oldest byte; returns -1 when the queue is empty. */
int ringbuffer_pop(struct ringbuffer *rb, unsigned char *out) {
    if (rb->count == 0) {
        return -1;
    }
    *out = rb->data[rb->tail];
    rb->tail = (rb->tail + 1) % rb->capacity;
    rb->count--;
    return 0;
}
