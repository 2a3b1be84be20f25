/* lanrelay: a TCP relay that holds every chunk of bytes for a fixed one-way delay, in each
 * direction, for the multihost scenario of `notifyq bench` on kernels without netem.
 *
 *   lanrelay DELAY_US TARGET_IP TARGET_PORT LISTEN_IP:PORT [LISTEN_IP:PORT ...]
 *
 * Listens on every LISTEN_IP:PORT (port 0: any free port), prints "lanrelay ready PORT..." (the
 * ports in the order given) and forwards each connection to TARGET_IP:TARGET_PORT. A chunk read
 * at t is written at t + DELAY_US (microseconds, fractions allowed); reading goes on meanwhile,
 * so order and throughput are kept. One thread: epoll, and a timerfd armed for the earliest due
 * chunk (timer slack 1 ns). EOF is passed on, after the delay, as a shutdown of the other side's
 * write end; an error on either side closes both. A direction stops reading while more than
 * CAP bytes wait in it. Linux only; stops on SIGTERM (the kernel closes every socket).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#define CAP (4u << 20)
#define READ_SIZE 65536
#define MAX_LISTEN 64

enum kind { LISTENER, TIMER, SIDE };

struct chunk {
    struct chunk *next;
    int64_t due;  /* CLOCK_MONOTONIC, ns */
    size_t len;   /* 0: the EOF marker */
    size_t off;
    char data[];
};

struct queue { /* one direction: bytes read from side[d], to be written to side[1 - d] */
    struct chunk *head, *tail;
    size_t bytes;
    int eof_read;  /* side[d] sent EOF (its marker is queued or delivered) */
    int shut_done; /* the EOF reached side[1 - d] as a shutdown of its write end */
    int blocked;   /* the last write to side[1 - d] could not finish: wait for EPOLLOUT */
};

struct conn;

struct side {
    enum kind kind; /* SIDE; first, like in struct tagged */
    int fd;
    uint32_t events; /* what epoll watches for now; ~0u: not registered */
    struct conn *conn;
    int index; /* 0: the accepted client, 1: the connection to the target */
};

struct conn {
    struct side side[2];
    struct queue q[2];
    int connecting; /* side[1]'s connect has not finished */
    int dead;
    struct conn *prev, *next;
};

struct tagged {
    enum kind kind;
    int fd;
};

static int ep;
static struct tagged timer;
static struct conn *conns;
static int64_t delay_ns;
static struct sockaddr_in target;

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void die(const char *what) {
    perror(what);
    exit(1);
}

static void set_nodelay(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static void kill_conn(struct conn *c) {
    if (c->dead) return;
    c->dead = 1;
    for (int i = 0; i < 2; i++) {
        if (c->side[i].fd >= 0) {
            close(c->side[i].fd); /* also leaves the epoll set */
            c->side[i].fd = -1;
        }
    }
}

static void free_conn(struct conn *c) {
    for (int d = 0; d < 2; d++) {
        struct chunk *k = c->q[d].head;
        while (k) {
            struct chunk *next = k->next;
            free(k);
            k = next;
        }
    }
    if (c->prev) c->prev->next = c->next;
    else conns = c->next;
    if (c->next) c->next->prev = c->prev;
    free(c);
}

static void push(struct queue *q, const char *data, size_t len, int64_t due) {
    struct chunk *k = malloc(sizeof *k + len);
    if (!k) die("malloc");
    k->next = NULL;
    k->due = due;
    k->len = len;
    k->off = 0;
    if (len) memcpy(k->data, data, len);
    if (q->tail) q->tail->next = k;
    else q->head = k;
    q->tail = k;
    q->bytes += len;
}

static void pop(struct queue *q) {
    struct chunk *k = q->head;
    q->head = k->next;
    if (!q->head) q->tail = NULL;
    free(k);
}

/* Reads one chunk from side[d] into q[d]. */
static void read_side(struct conn *c, int d) {
    static char buf[READ_SIZE];
    struct queue *q = &c->q[d];
    ssize_t n = recv(c->side[d].fd, buf, sizeof buf, 0);
    int64_t due = now_ns() + delay_ns;
    if (n > 0) {
        push(q, buf, (size_t)n, due);
    } else if (n == 0) {
        push(q, NULL, 0, due);
        q->eof_read = 1;
    } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        kill_conn(c);
    }
}

/* Writes the due chunks of q[d] to side[1 - d], as far as it takes them. */
static void flush(struct conn *c, int d, int64_t now) {
    struct queue *q = &c->q[d];
    int fd = c->side[1 - d].fd;
    if (c->connecting || q->blocked) return;
    while (!c->dead && q->head && q->head->due <= now) {
        struct chunk *k = q->head;
        if (k->len == 0) {
            shutdown(fd, SHUT_WR);
            q->shut_done = 1;
            pop(q);
            continue;
        }
        ssize_t n = send(fd, k->data + k->off, k->len - k->off, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) q->blocked = 1;
            else if (errno != EINTR) kill_conn(c);
            return;
        }
        k->off += (size_t)n;
        q->bytes -= (size_t)n;
        if (k->off < k->len) {
            q->blocked = 1; /* a partial write: the socket's buffer is full */
            return;
        }
        pop(q);
    }
}

/* Tells epoll what each side waits for now. */
static void watch(struct conn *c) {
    for (int i = 0; i < 2 && !c->dead; i++) {
        struct side *s = &c->side[i];
        uint32_t want = 0;
        if (!c->q[i].eof_read && c->q[i].bytes < CAP && !(i == 1 && c->connecting))
            want |= EPOLLIN;
        if ((i == 1 && c->connecting) || c->q[1 - i].blocked) want |= EPOLLOUT;
        if (c->q[i].eof_read && c->q[1 - i].shut_done) {
            /* Both ways done on this socket: epoll would report its hang-up forever. */
            if (s->events != ~0u) epoll_ctl(ep, EPOLL_CTL_DEL, s->fd, NULL);
            s->events = ~0u;
            continue;
        }
        if (want == s->events) continue;
        struct epoll_event ev = {.events = want, .data.ptr = s};
        if (epoll_ctl(ep, s->events == ~0u ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, s->fd, &ev) < 0)
            kill_conn(c);
        s->events = want;
    }
}

static void accept_one(int lfd) {
    int cfd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (cfd < 0) return;
    int tfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (tfd < 0) {
        close(cfd);
        return;
    }
    set_nodelay(cfd);
    set_nodelay(tfd);
    struct conn *c = calloc(1, sizeof *c);
    if (!c) die("calloc");
    if (connect(tfd, (struct sockaddr *)&target, sizeof target) < 0) {
        if (errno != EINPROGRESS) {
            close(cfd);
            close(tfd);
            free(c);
            return;
        }
        c->connecting = 1;
    }
    for (int i = 0; i < 2; i++) {
        c->side[i].kind = SIDE;
        c->side[i].fd = i ? tfd : cfd;
        c->side[i].events = ~0u;
        c->side[i].conn = c;
        c->side[i].index = i;
    }
    c->next = conns;
    if (conns) conns->prev = c;
    conns = c;
    watch(c);
}

static void on_side(struct side *s, uint32_t events) {
    struct conn *c = s->conn;
    if (c->dead) return;
    int i = s->index;
    if (i == 1 && c->connecting) {
        int err = 0;
        socklen_t len = sizeof err;
        getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err || (events & (EPOLLERR | EPOLLHUP))) {
            kill_conn(c);
            return;
        }
        if (!(events & EPOLLOUT)) return;
        c->connecting = 0;
    }
    if (events & EPOLLERR) {
        kill_conn(c);
        return;
    }
    if (events & EPOLLOUT) c->q[1 - i].blocked = 0;
    if ((events & (EPOLLIN | EPOLLHUP)) && !c->q[i].eof_read && c->q[i].bytes < CAP)
        read_side(c, i);
}

static void arm_timer(int64_t now) {
    int64_t next = INT64_MAX;
    for (struct conn *c = conns; c; c = c->next) {
        for (int d = 0; d < 2 && !c->dead; d++) {
            struct chunk *k = c->q[d].head;
            if (k && k->due > now && k->due < next) next = k->due;
        }
    }
    struct itimerspec its = {0};
    if (next != INT64_MAX) {
        its.it_value.tv_sec = next / 1000000000;
        its.it_value.tv_nsec = next % 1000000000;
    }
    timerfd_settime(timer.fd, TFD_TIMER_ABSTIME, &its, NULL);
}

static int listen_on(const char *spec) {
    char host[64];
    const char *colon = strrchr(spec, ':');
    if (!colon || (size_t)(colon - spec) >= sizeof host) return -1;
    memcpy(host, spec, (size_t)(colon - spec));
    host[colon - spec] = 0;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) return -1;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(fd, 512) < 0) return -1;
    return fd;
}

int main(int argc, char **argv) {
    if (argc < 5 || argc - 4 > MAX_LISTEN) {
        fprintf(stderr, "usage: %s DELAY_US TARGET_IP TARGET_PORT LISTEN_IP:PORT...\n", argv[0]);
        return 2;
    }
    delay_ns = (int64_t)(strtod(argv[1], NULL) * 1000.0);
    target.sin_family = AF_INET;
    target.sin_port = htons((uint16_t)atoi(argv[3]));
    if (delay_ns < 0 || inet_pton(AF_INET, argv[2], &target.sin_addr) != 1) {
        fprintf(stderr, "lanrelay: bad delay or target address\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    ep = epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0) die("epoll_create1");
    timer.kind = TIMER;
    timer.fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (timer.fd < 0) die("timerfd_create");
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &timer};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, timer.fd, &ev) < 0) die("epoll_ctl");
    static struct tagged listeners[MAX_LISTEN];
    printf("lanrelay ready");
    for (int i = 4; i < argc; i++) {
        struct tagged *l = &listeners[i - 4];
        l->kind = LISTENER;
        l->fd = listen_on(argv[i]);
        if (l->fd < 0) die(argv[i]);
        struct sockaddr_in sa;
        socklen_t len = sizeof sa;
        getsockname(l->fd, (struct sockaddr *)&sa, &len);
        printf(" %d", ntohs(sa.sin_port));
        ev.events = EPOLLIN;
        ev.data.ptr = l;
        if (epoll_ctl(ep, EPOLL_CTL_ADD, l->fd, &ev) < 0) die("epoll_ctl");
    }
    printf("\n");
    fflush(stdout);

    struct epoll_event events[128];
    for (;;) {
        int n = epoll_wait(ep, events, 128, -1);
        if (n < 0) {
            if (errno == EINTR) continue;
            die("epoll_wait");
        }
        for (int e = 0; e < n; e++) {
            struct tagged *t = events[e].data.ptr;
            if (t->kind == LISTENER) {
                accept_one(t->fd);
            } else if (t->kind == TIMER) {
                uint64_t expirations;
                if (read(timer.fd, &expirations, sizeof expirations) < 0 && errno != EAGAIN)
                    die("timerfd read");
            } else {
                on_side((struct side *)t, events[e].events);
            }
        }
        int64_t now = now_ns();
        for (struct conn *c = conns, *next; c; c = next) {
            next = c->next;
            for (int d = 0; d < 2; d++) flush(c, d, now);
            if (!c->dead && c->q[0].shut_done && c->q[1].shut_done) kill_conn(c);
            if (c->dead) free_conn(c);
            else watch(c);
        }
        arm_timer(now);
    }
}
