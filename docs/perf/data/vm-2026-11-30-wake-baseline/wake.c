#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <sys/resource.h>
#include <sys/syscall.h>
static int mode;
static volatile int stop;
static void *spin(void *a){
  if(mode==1) setpriority(PRIO_PROCESS, syscall(SYS_gettid), 10);
  if(mode==2){ struct sched_param p={0}; pthread_setschedparam(pthread_self(), SCHED_IDLE, &p);}
  if(mode==3){ struct sched_param p={0}; pthread_setschedparam(pthread_self(), SCHED_BATCH, &p);}
  volatile unsigned long x=0; while(!stop) x++; return 0;}
static double now(){struct timespec t; clock_gettime(CLOCK_MONOTONIC,&t); return t.tv_sec*1e6+t.tv_nsec/1e3;}
static int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
int main(int c,char**v){ mode=atoi(v[1]); pthread_t t[2]; int nt=c>2?atoi(v[2]):2; for(int i=0;i<nt;i++) pthread_create(&t[i],0,spin,0);
  usleep(100000); int n=2000; double *late=malloc(n*sizeof(double));
  for(int i=0;i<n;i++){ double s=now(); struct timespec d={0,200000}; nanosleep(&d,0); late[i]=now()-s-200; }
  stop=1; qsort(late,n,sizeof(double),cmp);
  printf("mode %d, %d spinning threads: late p50 %.0f p99 %.0f p999 %.0f max %.0f us\n",mode,nt,late[n/2],late[n*99/100],late[n*999/1000],late[n-1]); }
